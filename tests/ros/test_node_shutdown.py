"""A node process started by ``nodes.common.run_node`` (one node) or ``run_nodes`` (several on one
MultiThreadedExecutor, as the composed graph runs them) stops promptly and cleanly on SIGINT/SIGTERM,
also when the middleware's wake-up of the executor is missed or a callback is still running, and says
where it hangs when it does not stop.

A CI run saw the controller, in the second network namespace of the HIL test, ignore SIGINT and SIGTERM
after the simulator had stopped (no simulated time, so no timer woke its ``spin()``) until SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

_NODE = """
import sys, threading, time
import rclpy
import rclpy.signals
from rclpy.executors import MultiThreadedExecutor
from rclpy.node import Node
from rad2_ros.nodes.common import run_node, run_nodes

MODE = sys.argv[1]

class IdleNode(Node):
    # nothing ever becomes ready: no timer, a subscription nobody publishes to
    def __init__(self):
        super().__init__("idle_node")
        from std_msgs.msg import Header
        self.create_subscription(Header, "/nobody_publishes_here", lambda m: None, 1)
        if MODE.endswith("no_wakeup"):
            # rclpy's handlers are what wake a waiting executor; without them only the stop request of
            # run_node's own handler is left to notice the signal
            rclpy.signals.uninstall_signal_handlers()
        if MODE == "slow_start":
            print("CONSTRUCTING", flush=True)
            time.sleep(60)  # a planner loading and exporting its networks
        print("READY", flush=True)

class BusyNode(Node):
    # a callback that takes 1 s (a planning cycle under load), or never returns (a hang)
    def __init__(self):
        super().__init__("busy_node")
        self.create_timer(0.05, self.on_timer)

    def on_timer(self):
        if MODE == "composed_stuck":
            threading.Event().wait()
        time.sleep(1.0)

if MODE.startswith("composed"):
    sys.exit(run_nodes([IdleNode, BusyNode], executor_factory=lambda: MultiThreadedExecutor(num_threads=2)))
sys.exit(run_node(IdleNode))
"""


def _start(mode: str) -> subprocess.Popen:
    from ros_process import require_ros_build, ros_env, unique_domain_id

    require_ros_build()
    proc = subprocess.Popen([sys.executable, "-c", _NODE, mode], env=ros_env(unique_domain_id()),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    want = "CONSTRUCTING" if mode == "slow_start" else "READY"
    end = time.monotonic() + 60
    for line in proc.stdout:
        if line.strip() == want or time.monotonic() > end:
            break
    return proc


def _seconds_to_exit(proc: subprocess.Popen, sig: int, limit: float = 10.0) -> tuple[float, int]:
    time.sleep(0.3)
    t0 = time.monotonic()
    proc.send_signal(sig)
    try:
        code = proc.wait(timeout=limit)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        pytest.fail(f"the node did not exit within {limit} s of signal {sig}")
    return time.monotonic() - t0, code


@pytest.mark.parametrize(("mode", "sig"), [("idle", signal.SIGINT), ("idle", signal.SIGTERM),
                                            ("no_wakeup", signal.SIGINT), ("slow_start", signal.SIGINT),
                                            ("composed", signal.SIGINT), ("composed", signal.SIGTERM),
                                            ("composed_no_wakeup", signal.SIGINT)],
                         ids=["sigint", "sigterm", "sigint-without-wakeup", "sigint-while-constructing",
                              "composed-sigint", "composed-sigterm", "composed-sigint-without-wakeup"])
def test_node_exits_promptly_and_cleanly(mode, sig):
    proc = _start(mode)
    seconds, code = _seconds_to_exit(proc, sig)
    out = proc.stdout.read()
    assert code == 0, out[-2000:]
    assert seconds < 3.0, (seconds, out[-2000:])


def test_a_callback_that_never_returns_ends_the_teardown_with_its_stack():
    """The teardown waits for running callbacks; one that never returns must not keep the process
    alive until SIGKILL: the watchdog prints every thread's stack (naming the stuck callback) and
    ends the process with exit 1 after ``SHUTDOWN_DEADLINE_S``."""
    from rad2_ros.nodes.common import SHUTDOWN_DEADLINE_S

    proc = _start("composed_stuck")
    seconds, code = _seconds_to_exit(proc, signal.SIGINT, limit=SHUTDOWN_DEADLINE_S + 5.0)
    out = proc.stdout.read()
    assert code == 1, out[-2000:]
    assert SHUTDOWN_DEADLINE_S - 0.5 < seconds < SHUTDOWN_DEADLINE_S + 3.0, seconds
    assert "on_timer" in out, out[-3000:]


def test_sigusr1_prints_the_stacks_and_the_node_keeps_running():
    proc = _start("idle")
    time.sleep(0.3)
    proc.send_signal(signal.SIGUSR1)
    time.sleep(1.0)
    assert proc.poll() is None, "SIGUSR1 must not end the node"
    seconds, code = _seconds_to_exit(proc, signal.SIGINT)
    out = proc.stdout.read()
    assert code == 0 and seconds < 3.0, out[-2000:]
    assert "Current thread" in out or "Thread 0x" in out, out[-2000:]
    assert "spin_once" in out, out[-2000:]


def test_bringup_reports_seconds_to_stop(tmp_path):
    from ros_process import require_ros_build, unique_domain_id

    require_ros_build()
    from rad2_bringup import bringup

    b = bringup.Bringup("vehicle", domain_id=unique_domain_id(), log_dir=tmp_path, only=["supervisor"])
    with b:
        b.wait_ready(timeout=90)
    (proc,) = b.processes
    assert proc.returncode == 0, proc.log_tail()
    assert proc.stop_seconds is not None and proc.stop_seconds < 3.0, proc.stop_seconds
    assert os.path.exists(proc.log_path)


def test_nodes_stop_when_the_process_that_started_them_is_killed(tmp_path):
    """A launcher killed by SIGKILL (or the OOM killer) sends its nodes nothing: they live in sessions
    of their own. They must stop by themselves instead of planning on with nobody watching."""
    from ros_process import require_ros_build, ros_env, unique_domain_id

    require_ros_build()
    launcher = (
        "import sys, time\n"
        "from rad2_bringup import bringup\n"
        f"b = bringup.Bringup('vehicle', domain_id={unique_domain_id()}, log_dir={str(tmp_path)!r},"
        " only=['supervisor']).start()\n"
        "b.wait_ready(timeout=90)\n"
        "print(b.processes[0].popen.pid, flush=True)\n"
        "time.sleep(600)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", launcher], env=ros_env(), stdout=subprocess.PIPE,
                            text=True)
    node_pid = None
    try:
        node_pid = int(proc.stdout.readline())
        proc.kill()
        proc.wait()
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline and _running(node_pid):
            time.sleep(0.1)
        assert not _running(node_pid), "the supervisor node outlived its launcher by 10 s"
    finally:
        if proc.poll() is None:
            proc.kill()
        if node_pid is not None and _running(node_pid):
            os.kill(node_pid, signal.SIGKILL)
    log = (tmp_path / "supervisor.log").read_text()
    assert "is gone: stopping" in log, log[-2000:]


def _running(pid: int) -> bool:
    """``pid`` exists and is not a zombie (a reaped or never-waited-for process both count as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
