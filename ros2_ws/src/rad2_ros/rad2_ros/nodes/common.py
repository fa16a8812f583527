"""Helpers shared by every rad2 node (perception, planner, controller, sim): one copy, used by all.

- QoS profiles: ``sensor_qos`` (best effort, keep-last-1: BEV, tokens, odometry, objects),
  ``command_qos`` (reliable keep-last-1: trajectories, control commands; optional deadline and
  liveliness lease), ``report_qos`` (reliable keep-last-10: diagnostics, markers, results).
- The nodes' ROS parameters, declared from the files and schemas: ``rad2_ros.nodes.parameters``.
- ``CycleStats``: per-cycle diagnostics accumulation (stage timings, end-to-end latency, deadline
  misses, rejected inputs, fallback state) with running percentiles.
- ``Throttle``: rate-limited logging for faults that may repeat every cycle.
- ``Heartbeat``: a thread publishing ``/heartbeat/<node>`` (std_msgs/Header, frame_id = node name)
  every ``heartbeat.period_s``, so the controller and the supervisor notice a dead node within a few
  periods whatever its executor is busy with; one topic per node (``heartbeat_topic``). The controller
  and the supervisor run on UDP only (``use_udp_transport``), so that no node's death can lock a
  shared-memory port they write into.
- ``DiagnosticsReporter``: the node's status on ``/diagnostics`` (diagnostic_msgs/DiagnosticArray,
  one DiagnosticStatus named after the node: level, message naming the fault, key/value counters).
- ``run_node``: the ``main()`` body every node uses (init, spin, clean shutdown on SIGINT/SIGTERM);
  ``run_nodes`` the same for several nodes on one executor (the composed graph).

Composition contract (rad2 graph up --composed): a node class takes ``**kwargs`` and forwards
them to ``rclpy.node.Node.__init__`` (``cli_args`` carries ``-r __node:=NAME``, the parameter files
and ``-p`` overrides), so the same class runs as its own process or inside one executor.
"""

from __future__ import annotations

import faulthandler
import gc
import math
import signal
import struct
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
from rclpy.callback_groups import CallbackGroup
from rclpy.duration import Duration
from rclpy.node import Node
from rclpy.qos import (
    DurabilityPolicy,
    HistoryPolicy,
    LivelinessPolicy,
    QoSProfile,
    ReliabilityPolicy,
)
from std_msgs.msg import Header

from rad2_ros.rosenv import exit_with_parent

# --------------------------------------------------------------------------------------------------
# QoS
# --------------------------------------------------------------------------------------------------


# A polled odometry reader (``PolledCallbackGroup``) keeps this many samples between two reads, each
# validated in order when read: the 0.1 s between object lists at 100 Hz, a 0.4 s stall of the
# controller at 50 Hz. In a flood the newest win: the older ones are overwritten inside the
# middleware, never seen by Python.
POLLED_DEPTH = 20


def sensor_qos(depth: int = 1) -> QoSProfile:
    """Sensor-like streams (best effort, keep-last-``depth``): 1 where only the newest sample matters,
    ``POLLED_DEPTH`` for a polled reader that validates each one."""
    return QoSProfile(
        reliability=ReliabilityPolicy.BEST_EFFORT,
        history=HistoryPolicy.KEEP_LAST,
        depth=depth,
        durability=DurabilityPolicy.VOLATILE,
    )


class PolledCallbackGroup(CallbackGroup):
    """The callback group of a subscription the executor never waits on: its samples wait in the
    reader's keep-last history until the node reads them with :func:`take_waiting` where it uses them
    (the controller at each cycle, perception with each object list).

    Why: every sample a subscription delivers costs an executor wake-up in Python (the wait set rebuilt,
    the callback dispatched: ~0.1 ms), even one a rate gate then drops on its stamp. A sender flooding
    odometry at 1 kHz took a tenth of a core from each reader that way, on a host where the planner
    needs every core. Polled, a flood costs the middleware's copy of each sample, and Python reads at
    most the history's depth per use: the newest samples win."""

    def can_execute(self, entity) -> bool:
        return False

    def beginning_execution(self, entity) -> bool:
        return False

    def ending_execution(self, entity) -> None:
        return None


def take_waiting(sub, handle_message: Callable[[Any], None], limit: int = 50) -> int:
    """Hand every message waiting on ``sub`` (up to ``limit``), oldest first, to ``handle_message`` now;
    returns how many. For polled subscriptions, and for a node whose cycle takes longer than its timer
    period: the single-threaded executor runs a ready timer before ready subscriptions, so on a loaded
    CPU the timer is always ready and subscriptions would wait indefinitely."""
    taken_count = 0
    try:
        for _ in range(limit):
            with sub.handle:
                taken = sub.handle.take_message(sub.msg_type, sub.raw)
            if taken is None:
                break
            handle_message(taken[0])
            taken_count += 1
    except Exception:  # noqa: BLE001 -- a destroyed subscription at shutdown: nothing to take
        pass
    return taken_count


def cdr_header_stamp_ns(data: bytes) -> int:
    """``header.stamp`` in ns of a serialized message whose first field is a std_msgs/Header (Odometry,
    PerceptionInputs, ...), read from the CDR bytes without deserializing: what a flood check costs
    per surplus message (0.2 us, where deserializing an Odometry takes ~36 us). 0 for bytes too short."""
    if len(data) < 12:
        return 0
    order = "<" if data[1] & 1 else ">"  # CDR encapsulation: 0x0001 little endian, 0x0000 big endian
    sec, nanosec = struct.unpack_from(order + "iI", data, 4)
    return sec * 1_000_000_000 + nanosec


def command_qos(deadline_s: float | None = None, lease_s: float | None = None, depth: int = 1) -> QoSProfile:
    """Trajectories and control commands: reliable, keep-last-``depth``, volatile (a late joiner must not
    get a stale plan). A reader that validates every message asks for more than 1, so a bad one is seen
    and reported even when a good one follows before the reader runs. ``deadline_s`` / ``lease_s`` add
    the DDS deadline and liveliness contracts (both sides must offer/request compatible values)."""
    qos = QoSProfile(
        reliability=ReliabilityPolicy.RELIABLE,
        history=HistoryPolicy.KEEP_LAST,
        depth=depth,
        durability=DurabilityPolicy.VOLATILE,
    )
    if deadline_s:
        qos.deadline = Duration(seconds=deadline_s)
    if lease_s:
        qos.liveliness = LivelinessPolicy.AUTOMATIC
        qos.liveliness_lease_duration = Duration(seconds=lease_s)
    return qos


def setting_qos() -> QoSProfile:
    """A setting that holds until replaced (the mission speed): reliable, keep-last-1, transient local,
    so a node that starts or restarts later still gets the value in force."""
    return QoSProfile(
        reliability=ReliabilityPolicy.RELIABLE,
        history=HistoryPolicy.KEEP_LAST,
        depth=1,
        durability=DurabilityPolicy.TRANSIENT_LOCAL,
    )


def report_qos(depth: int = 10) -> QoSProfile:
    """Diagnostics, markers, episode results: reliable, a few deep, volatile."""
    return QoSProfile(
        reliability=ReliabilityPolicy.RELIABLE,
        history=HistoryPolicy.KEEP_LAST,
        depth=depth,
        durability=DurabilityPolicy.VOLATILE,
    )


# --------------------------------------------------------------------------------------------------
# Diagnostics
# --------------------------------------------------------------------------------------------------


@dataclass
class CycleReport:
    """What one cycle reports (the planner node turns it into rad2_msgs/PlanningDiagnostics)."""

    stages_ms: dict[str, float]
    total_ms: float
    end_to_end_ms: float
    deadline_missed: bool
    cycle_count: int
    deadline_miss_count: int
    rejected_input_count: int
    fallback_active: bool
    fallback_reason: str


@dataclass
class CycleStats:
    """Counters and a latency window for a periodic node; ``record`` is called once per cycle."""

    deadline_ms: float
    window: int = 2000
    cycle_count: int = 0
    deadline_miss_count: int = 0
    rejected_input_count: int = 0
    fallback_count: int = 0
    _e2e: deque = field(default_factory=deque)
    _total: deque = field(default_factory=deque)

    def reject(self, n: int = 1) -> None:
        self.rejected_input_count += n

    def record(
        self,
        stages_ms: dict[str, float],
        total_ms: float,
        end_to_end_ms: float,
        fallback_reason: str = "",
    ) -> CycleReport:
        self.cycle_count += 1
        # A cycle misses its deadline when its end-to-end latency (input stamp -> publication) or,
        # when the stamp is not comparable (NaN), its own wall time exceeds the budget.
        basis = end_to_end_ms if math.isfinite(end_to_end_ms) else total_ms
        missed = bool(basis > self.deadline_ms)
        self.deadline_miss_count += int(missed)
        self.fallback_count += int(bool(fallback_reason))
        for q, v in ((self._e2e, end_to_end_ms), (self._total, total_ms)):
            q.append(float(v))
            while len(q) > self.window:
                q.popleft()
        return CycleReport(
            stages_ms=dict(stages_ms),
            total_ms=float(total_ms),
            end_to_end_ms=float(end_to_end_ms),
            deadline_missed=missed,
            cycle_count=self.cycle_count,
            deadline_miss_count=self.deadline_miss_count,
            rejected_input_count=self.rejected_input_count,
            fallback_active=bool(fallback_reason),
            fallback_reason=fallback_reason,
        )

    def percentiles(self, which: str = "end_to_end", qs=(50, 90, 99)) -> dict[str, float]:
        data = np.asarray(self._e2e if which == "end_to_end" else self._total, dtype=float)
        data = data[np.isfinite(data)]
        if data.size == 0:
            return {f"p{q}": math.nan for q in qs} | {"max": math.nan}
        return {f"p{q}": float(np.percentile(data, q)) for q in qs} | {"max": float(data.max())}


class Throttle:
    """``if throttle("nan_bev"): log(...)`` at most once per ``period_s`` per key (counts suppressed)."""

    def __init__(self, period_s: float = 2.0):
        self.period_s = period_s
        self._last: dict[str, float] = {}
        self.suppressed: dict[str, int] = {}

    def __call__(self, key: str) -> bool:
        now = time.monotonic()
        if now - self._last.get(key, -math.inf) >= self.period_s:
            self._last[key] = now
            return True
        self.suppressed[key] = self.suppressed.get(key, 0) + 1
        return False


# --------------------------------------------------------------------------------------------------
# Heartbeats and /diagnostics
# --------------------------------------------------------------------------------------------------

HEARTBEAT_TOPIC = "/heartbeat"
DIAGNOSTICS_TOPIC = "/diagnostics"


def heartbeat_topic(node_name: str) -> str:
    """``/heartbeat/<node>``: one topic per node, so a node's beats reach only the processes that watch
    it. With Fast DDS's shared-memory transport every reader process has one port that all its
    writers push into under an interprocess mutex; a writer killed while holding it blocks every other
    writer into that port for the mutex's 1 s timeout (compiled into Fast DDS), and rclpy holds the GIL
    through that publish, so the whole writing process stands still. One /heartbeat topic put every
    node's writer into the controller's port: a perception process killed at the wrong instant froze
    the controller for a second."""
    return f"{HEARTBEAT_TOPIC}/{node_name}"


def use_udp_transport() -> str | None:
    """Before ``rclpy.init``: make this process's participant UDP-only when it runs on rad2's
    localhost profile (tools/fastdds_localhost.xml): the same profile with its shared-memory transport
    removed, written beside the log directory and selected through FASTDDS_DEFAULT_PROFILES_FILE.
    Another profile (a vehicle network's) is left as it is. Returns the profile now in force (None:
    none set).

    For the processes that must never stand still because another one died: the controller (whose
    commands and diagnostics would otherwise go into the shared-memory port of any reader, e.g. a
    diagnostics monitor that a dying node was writing into) and the supervisor (every node writes to
    it). A UDP-only participant sends and receives everything over loopback UDP, where a dead process
    leaves no lock; they exchange only small messages, so nothing is lost to fragmentation."""
    import hashlib
    import os
    import tempfile
    import xml.etree.ElementTree as ET

    current = os.environ.get("FASTDDS_DEFAULT_PROFILES_FILE")
    if not current or not current.endswith("fastdds_localhost.xml"):
        return current
    ns = {"d": "http://www.eprosima.com"}
    ET.register_namespace("", ns["d"])
    tree = ET.parse(current)
    shm = {t.findtext("d:transport_id", namespaces=ns) for t in tree.iterfind(".//d:transport_descriptor", ns)
           if t.findtext("d:type", namespaces=ns) == "SHM"}
    for parent in tree.iterfind(".//d:userTransports", ns):
        for tid in list(parent):
            if tid.text in shm:
                parent.remove(tid)
    for descriptors in tree.iterfind(".//d:transport_descriptors", ns):
        for t in list(descriptors):
            if t.findtext("d:transport_id", namespaces=ns) in shm:
                descriptors.remove(t)
    out_dir = os.environ.get("ROS_LOG_DIR") or tempfile.gettempdir()
    os.makedirs(out_dir, exist_ok=True)
    tag = hashlib.sha256(os.path.abspath(current).encode()).hexdigest()[:12]
    path = os.path.join(out_dir, f"rad2_localhost_udp_{tag}.xml")
    tmp = f"{path}.{os.getpid()}.tmp"
    tree.write(tmp, xml_declaration=True, encoding="UTF-8")
    os.replace(tmp, path)  # several processes may write it at once: each writes the same content
    os.environ["FASTDDS_DEFAULT_PROFILES_FILE"] = path
    # With ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST rmw_fastrtps sets the transports itself (shared
    # memory included) over the profile's; SYSTEM_DEFAULT leaves them to the profile, whose UDP
    # interface whitelist (127.0.0.1) keeps discovery and data on this machine all the same.
    if os.environ.get("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST") == "LOCALHOST":
        os.environ["ROS_AUTOMATIC_DISCOVERY_RANGE"] = "SYSTEM_DEFAULT"
    return path


def heartbeat_qos() -> QoSProfile:
    """Heartbeats: best effort, a few deep (a late one is useless, a blocked writer is worse)."""
    return QoSProfile(reliability=ReliabilityPolicy.BEST_EFFORT, history=HistoryPolicy.KEEP_LAST, depth=5,
                      durability=DurabilityPolicy.VOLATILE)


class Heartbeat:
    """Publishes ``std_msgs/Header(stamp=node clock, frame_id=node name)`` on ``/heartbeat/<node>``
    (``heartbeat_topic``) every ``period_s`` from a daemon thread (not the executor: a long planning
    cycle must not look like a dead node; a killed or crashed process stops beating). ``stop()``
    before destroying the node."""

    def __init__(self, node: Node, period_s: float):
        self.node = node
        self.period_s = float(period_s)
        self.name = node.get_name()
        self.pub = node.create_publisher(Header, heartbeat_topic(self.name), heartbeat_qos())
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"{self.name}_heartbeat", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            try:
                stamp = self.node.get_clock().now().to_msg()
                self.pub.publish(Header(stamp=stamp, frame_id=self.name))
            except Exception:  # noqa: BLE001 -- shutting down (context invalid): stop beating
                return

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=1.0)


def stop_heartbeat(node: Node) -> None:
    """Stop ``node.heartbeat`` if the node got as far as starting one. rclpy destroys a node whose
    ``__init__`` failed when the context shuts down; its ``destroy_node`` must not fail on the attributes
    the constructor never set (that second error used to bury the real one)."""
    beat = getattr(node, "heartbeat", None)
    if beat is not None:
        beat.stop()


LEVELS = {"ok": DiagnosticStatus.OK, "warn": DiagnosticStatus.WARN, "error": DiagnosticStatus.ERROR,
          "stale": DiagnosticStatus.STALE}


def diagnostic_status(name: str, level: str, message: str, values: dict[str, Any] | None = None,
                      hardware_id: str = "rad2") -> DiagnosticStatus:
    return DiagnosticStatus(level=LEVELS[level], name=name, message=message[:1000], hardware_id=hardware_id,
                            values=[KeyValue(key=str(k), value=str(v)) for k, v in (values or {}).items()])


class DiagnosticsReporter:
    """A node's status on /diagnostics: ``publish(level, message, values)`` (level ok|warn|error|stale)."""

    def __init__(self, node: Node):
        self.node = node
        self.pub = node.create_publisher(DiagnosticArray, DIAGNOSTICS_TOPIC, report_qos(20))

    def publish_statuses(self, statuses: list[DiagnosticStatus]) -> None:
        arr = DiagnosticArray(status=statuses)
        arr.header.stamp = self.node.get_clock().now().to_msg()
        self.pub.publish(arr)

    def publish(self, level: str, message: str, values: dict[str, Any] | None = None) -> None:
        self.publish_statuses([diagnostic_status(self.node.get_name(), level, message, values)])


# --------------------------------------------------------------------------------------------------
# main()
# --------------------------------------------------------------------------------------------------


SHUTDOWN_GRACE_S = 2.0


def _context_goes_down(rclpy_module, within_s: float) -> bool:
    """True once the default context is shut down, waiting at most ``within_s`` for it."""
    end = time.monotonic() + within_s
    try:
        while rclpy_module.ok():
            if time.monotonic() >= end:
                return False
            time.sleep(0.02)
    except KeyboardInterrupt:  # the interrupt that was pending when the take failed: a stop request
        return True
    return True


SPIN_SLICE_S = 0.1  # the longest the main thread waits in the middleware before it looks at a stop request
SHUTDOWN_DEADLINE_S = 5.0  # teardown (destroy the node, shut the context down) must end within this


def _install_stop_handlers(stop: threading.Event, spinning: threading.Event) -> dict[int, Any]:
    """SIGINT and SIGTERM set ``stop``; returns the handlers they replace. Installed before
    ``rclpy.init``, whose own handlers (which shut the context down and wake the executor) chain to them,
    so a stop request is seen even if that wake-up is missed. Before ``spinning`` is set (a planner can
    spend many seconds loading its networks) the signal also interrupts, as Python's default handler
    would. Only the main thread may install handlers."""
    if threading.current_thread() is not threading.main_thread():
        return {}

    def request_stop(*_) -> None:
        stop.set()
        if not spinning.is_set():
            raise KeyboardInterrupt

    return {sig: signal.signal(sig, request_stop) for sig in (signal.SIGINT, signal.SIGTERM)}


def run_node(node_class, args: list[str] | None = None, **kwargs) -> int:
    """Create ``node_class`` and spin it until shutdown; SIGINT/SIGTERM end it cleanly (exit 0). See
    ``run_nodes``."""
    return run_nodes([lambda: node_class(**kwargs)], args=args,
                     label=str(getattr(node_class, "__name__", node_class)))


def run_nodes(factories: list[Callable[[], Node]], args: list[str] | None = None,
              executor_factory: Callable[[], Any] | None = None, duration: float | None = None,
              on_started: Callable[[list[Node]], None] | None = None, label: str = "rad2") -> int:
    """Create a node from each of ``factories`` (in order) and spin them all on one executor
    (``executor_factory()``, a SingleThreadedExecutor by default) until SIGINT/SIGTERM or ``duration``
    seconds; exit 0 on a requested stop, 1 when a node failed to start. A separate node process runs
    one node (``run_node``); the composed graph runs every node of a graph here.

    The executor spins in slices of ``SPIN_SLICE_S`` rather than ``spin()``: a plain ``spin()`` waits in
    the middleware until an entity is ready, and once the simulator or the inputs have stopped (simulated
    time no longer advances the timers) a stop that fails to wake that wait left a node running until
    SIGKILL (a CI run saw the controller ignore SIGINT and SIGTERM, and later the composed graph).
    Teardown runs under a ``faulthandler`` watchdog: a hang there prints every thread's stack and ends
    the process (exit 1) after ``SHUTDOWN_DEADLINE_S``. SIGUSR1 prints the stacks at any time."""
    import rclpy
    from rclpy.executors import ExternalShutdownException, SingleThreadedExecutor

    stop, spinning = threading.Event(), threading.Event()
    previous_handlers = _install_stop_handlers(stop, spinning)
    rclpy.init(args=args)
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    exit_with_parent()  # started by Bringup or a test: stop when that process is gone (rosenv.py)
    nodes: list[Node] = []
    executor = None
    start_error: BaseException | None = None
    try:
        try:
            for factory in factories:
                nodes.append(factory())
        except (KeyboardInterrupt, ExternalShutdownException):
            raise
        except Exception as exc:  # noqa: BLE001 -- reported last, after the teardown (below)
            start_error = exc
            traceback.print_exc()
            return 1
        # Everything allocated at start-up (torch, ONNX Runtime, the networks, the map) lives as long
        # as the process: move it out of the collector's reach, so a full collection scans only what
        # the cycles allocate. Under a CPU hog a full collection over the start-up heap held the GIL
        # long enough to delay the heartbeat thread by 0.3-0.5 s (the soak's planner-heartbeat gaps).
        gc.collect()
        gc.freeze()
        executor = (executor_factory or SingleThreadedExecutor)()
        for node in nodes:
            executor.add_node(node)
        if on_started is not None:
            on_started(nodes)
        spinning.set()
        end = None if duration is None else time.monotonic() + duration
        while not stop.is_set() and rclpy.ok() and (end is None or time.monotonic() < end):
            executor.spin_once(timeout_sec=SPIN_SLICE_S)
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    except Exception:
        # A callback that was running when SIGINT shut the context down fails at its next ROS call
        # (e.g. a publisher whose context is no longer valid): that is the requested shutdown, not a
        # fault, and must not turn a clean stop into exit 1. rclpy shuts the context down from its own
        # signal thread, a moment after the signal: a message being taken at that instant fails first
        # (pybind11 "Unable to convert call argument", the interrupt pending in the conversion) while
        # the context still reads as up. So wait briefly for the shutdown before calling it a fault;
        # a genuine error, with no signal behind it, still propagates after the wait.
        if not stop.is_set() and not _context_goes_down(rclpy, SHUTDOWN_GRACE_S):
            raise
    finally:
        faulthandler.dump_traceback_later(SHUTDOWN_DEADLINE_S, exit=True)
        try:
            if executor is not None:
                try:
                    # a MultiThreadedExecutor also waits here for the callbacks still running
                    executor.shutdown(timeout_sec=1.0)
                except Exception:  # noqa: BLE001 -- its guard condition dies with a context already down
                    pass
            for node in nodes:
                try:
                    node.destroy_node()
                except Exception:  # noqa: BLE001 -- best effort on shutdown
                    pass
            rclpy.try_shutdown()
        finally:
            faulthandler.cancel_dump_traceback_later()
            for sig, handler in previous_handlers.items():
                signal.signal(sig, handler)
            if start_error is not None:
                # The teardown (rclpy destroys the half-built node, the middleware logs its own
                # shutdown) prints after the traceback; the cause of the failed start must be the last
                # line a reader of the log or the console sees.
                print(f"[{label}] failed to start: {type(start_error).__name__}: {start_error}",
                      file=sys.stderr, flush=True)
    return 0
