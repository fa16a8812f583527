"""Heartbeat supervisor node (``supervisor``): which node of the graph has stopped, on /diagnostics.

Subscribes ``/heartbeat/<node>`` of every watched node (std_msgs/Header, ``frame_id`` = the sending
node's name; every rad2 node publishes one every ``heartbeat.period_s`` from its own thread) and, every
``supervisor.period_s``,
publishes ``/diagnostics`` (diagnostic_msgs/DiagnosticArray) with one status per watched node
(``supervisor.expected_nodes``), named ``heartbeat/<node>``: OK while its last heartbeat is at most
``supervisor.timeout_s`` old, ERROR "<node> heartbeat lost: X s since the last one" after that, WARN
before the first. Losses and recoveries are also logged. The logic is ``supervision.HeartbeatMonitor``
(no ROS). The controller watches the planner's heartbeat itself (to stop); this node is what a vehicle
integrator reads to see which node failed, including the controller.

Every node writes to this one, so it runs without Fast DDS's shared-memory transport
(``common.use_udp_transport``, on rad2's localhost profile): a node killed while pushing into a
shared-memory port leaves that port's interprocess mutex locked for a second, and every other writer
into it (with the GIL held) stands still meanwhile; a UDP port has no such lock.

Parameters: params/nodes.yaml (``supervisor.*``).
"""

from __future__ import annotations

import time

from rad2_core.supervision import HeartbeatMonitor
from rclpy.node import Node
from std_msgs.msg import Header

from rad2_ros.nodes.common import (
    DiagnosticsReporter,
    diagnostic_status,
    heartbeat_qos,
    heartbeat_topic,
    run_node,
    use_udp_transport,
)
from rad2_ros.nodes.parameters import declare_parameters

PARAM_FILES = ["nodes"]
PREFIXES = ("supervisor",)


class SupervisorNode(Node):
    def __init__(self, **kwargs):
        super().__init__("supervisor", **kwargs)
        values = declare_parameters(self, PARAM_FILES, prefixes=PREFIXES,
                                    cli_args=kwargs.get("cli_args"))["supervisor"]
        self.expected = [str(n) for n in values["expected_nodes"]]
        timeout = float(values["timeout_s"])
        self.monitor = HeartbeatMonitor({name: timeout for name in self.expected})
        self.diagnostics = DiagnosticsReporter(self)
        self._lost: set[str] = set()
        self.period_ns = int(float(values["period_s"]) * 1e9)
        self._last_tick_ns: int | None = None
        for name in self.expected:
            self.create_subscription(Header, heartbeat_topic(name), self.on_heartbeat, heartbeat_qos())
        self.create_timer(float(values["period_s"]), self.on_timer)
        self.get_logger().info(f"supervising heartbeats of {self.expected} (timeout {timeout:g} s)")

    @staticmethod
    def _now_ns() -> int:
        """Heartbeats are judged on the monotonic clock even on simulated time: whether a process
        lives is a wall-clock matter, and /clock advances in bursts under load."""
        return time.monotonic_ns()

    def on_heartbeat(self, msg: Header) -> None:
        self.monitor.beat(msg.frame_id, self._now_ns())

    def on_timer(self) -> None:
        now = self._now_ns()
        last, self._last_tick_ns = self._last_tick_ns, now
        if last is None or now - last > 5 * self.period_ns:
            self.monitor.rebase(now)  # this timer itself did not run (simulated time paused, not scheduled)
        statuses = []
        for st in self.monitor.status(now):
            level = "error" if st.lost else ("ok" if st.seen else "warn")
            statuses.append(diagnostic_status(f"heartbeat/{st.name}", level, st.message, {
                "node": st.name, "age_s": f"{st.age_s:.3f}", "timeout_s": st.timeout_s}))
            if st.lost and st.name not in self._lost:
                self._lost.add(st.name)
                self.get_logger().error(st.message)
            elif not st.lost and st.name in self._lost:
                self._lost.discard(st.name)
                self.get_logger().info(f"{st.name} heartbeat back")
        self.diagnostics.publish_statuses(statuses)


def main(args=None) -> int:
    use_udp_transport()  # before the participant exists (rclpy.init in run_node)
    return run_node(SupervisorNode, args)


if __name__ == "__main__":
    raise SystemExit(main())
