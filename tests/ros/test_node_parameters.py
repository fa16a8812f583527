"""Parameters given to a node are applied or refused at start, never ignored.

Every node process of launch/graphs.yaml, started as ``rad2 graph up`` starts it (its parameter files,
then ``-p`` values), is given one bad value at a time: an unknown key on the command line, an unknown
key in a parameter file, a string for a number (rcl alone drops that ``-p`` in silence when a file gave
the key a number), another node's parameter by name. Asserted: the process exits non-zero within a
few seconds, its last line names the key, and no second traceback (``'PlannerNode' object has no
attribute 'heartbeat'``) follows the first. An integer for a float parameter is accepted as that
float. The bring-up resolves and checks ``--set`` before any process starts, and every ``--set``
example of its help text works.
"""

from __future__ import annotations

import re
import subprocess
import time

import pytest
from ros_process import ROOT, require_ros_build, ros_env, unique_domain_id

START_LIMIT_S = 20.0  # import of rclpy and the node module on a loaded 2-core machine, then the check


def _command(node: str, extra: list[str]) -> list[str]:
    from rad2_bringup import graphs
    from rad2_bringup.bringup import node_command

    spec = next(n for n in graphs.load_graph("vehicle" if node != "bev_warp_sim" else "simulation", {}).nodes
                if n.name == node)
    return [*node_command(spec), *extra]


def _run(node: str, extra: list[str], tmp_path, ready: str | None = None) -> tuple[int | None, float, str]:
    """(exit code, or None when still running after START_LIMIT_S or once ``ready`` is in its log;
    seconds; output)."""
    require_ros_build()
    log = tmp_path / f"{node}.log"
    t0 = time.monotonic()
    with log.open("w") as f:
        proc = subprocess.Popen(_command(node, extra), cwd=ROOT, env=ros_env(unique_domain_id()),
                                stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        code = None
        while code is None and time.monotonic() - t0 < START_LIMIT_S:
            code = proc.poll()
            if code is None and ready is not None and ready in log.read_text(errors="replace"):
                break
            time.sleep(0.1)
        if code is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    return code, time.monotonic() - t0, log.read_text(errors="replace")


def _last_line(out: str) -> str:
    lines = [s for s in out.splitlines() if s.strip() and "Failed to publish log message to rosout" not in s]
    return lines[-1] if lines else ""


BAD = [
    ("controller", ["-p", "controller.node.rate_hzz:=40.0"], "controller.node.rate_hzz"),
    ("controller", ["-p", "controller.node.rate_hz:=fast"], "controller.node.rate_hz"),
    ("controller", ["-p", "planner.deadline_ms:=80.0"], "planner.deadline_ms"),
    ("supervisor", ["-p", "supervisor.timeout:=0.3"], "supervisor.timeout"),
    ("bev_features", ["-p", "perception.history_s:=long"], "perception.history_s"),
    ("planner", ["-p", "planner.deadline:=80"], "planner.deadline"),
    ("planner", ["-p", "planner.deadline_ms:=eighty"], "planner.deadline_ms"),
]


@pytest.mark.parametrize(("node", "extra", "key"), BAD, ids=[f"{n}-{k}" for n, _, k in BAD])
def test_bad_parameter_fails_the_start_naming_the_key(node, extra, key, tmp_path):
    code, seconds, out = _run(node, extra, tmp_path)
    assert code not in (None, 0), out[-3000:]
    last = _last_line(out)
    print(f"{node} {' '.join(extra)}: exit {code} after {seconds:.1f} s: {last}")
    assert "failed to start" in last and key in last, out[-3000:]
    assert seconds < START_LIMIT_S
    assert "has no attribute 'heartbeat'" not in out and out.count("Traceback") <= 1, out[-3000:]


def test_unknown_key_in_a_parameter_file_fails_the_start(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("/**:\n  ros__parameters:\n    controller:\n      node:\n        stop_decell: 3.0\n")
    code, _, out = _run("controller", ["--params-file", str(bad)], tmp_path)
    assert code not in (None, 0), out[-3000:]
    last = _last_line(out)
    assert "controller.node.stop_decell" in last and "stop_decel" in last, last  # with the near name


def test_integer_for_a_float_is_taken_as_the_float(tmp_path):
    # the controller runs (no error within the limit) with the override in force
    code, _, out = _run("controller", ["-p", "controller.node.rate_hz:=40"], tmp_path, ready="ready")
    assert code is None, out[-3000:]
    assert "controller ready: 40 Hz" in out, out[-3000:]


def test_bringup_resolves_and_checks_set_before_starting():
    from rad2_bringup.bringup import Bringup, BringupError

    t0 = time.monotonic()
    b = Bringup("vehicle", overrides={"planner": {"deadline_ms": 80}}, domain_id=1)
    args = b.process("planner").command
    assert "planner.deadline_ms:=80.0" in args, args
    for overrides, key in (({"planner": {"deadline": 80}}, "deadline"),
                           ({"planner": {"planner.deadline_ms": "abc"}}, "planner.deadline_ms"),
                           ({"controller": {"planner.deadline_ms": 80}}, "planner.deadline_ms")):
        with pytest.raises(BringupError, match=re.escape(key)):
            Bringup("vehicle", overrides=overrides, domain_id=1)
    assert time.monotonic() - t0 < 5.0


def test_every_set_example_of_the_graph_up_help_works():
    from rad2_bringup.bringup import Bringup
    from rad2_bringup.cli import graph_up
    from rad2_core.config import parse_node_overrides

    examples = re.findall(r"rad2 graph up (\S+)(.*)", graph_up.__doc__)
    sets = [(graph, re.findall(r"--set (\S+)", rest)) for graph, rest in examples if "--set" in rest]
    assert sets, graph_up.__doc__
    for graph, items in sets:
        b = Bringup(graph, overrides=parse_node_overrides(items), domain_id=1)
        for item in items:
            node, _, rest = item.partition(".")
            key, _, value = rest.partition("=")
            cmd = " ".join(b.process(node).command)
            pattern = rf"\b({re.escape(node)}\.)?{re.escape(key)}:={re.escape(value)}"
            assert re.search(pattern, cmd), (item, cmd)


def test_bringup_reports_a_node_that_dies_at_start_within_seconds(tmp_path):
    """The readiness wait ends as soon as a node process exits, with the node's own error last."""
    require_ros_build()
    from rad2_bringup.bringup import Bringup, BringupError

    # a value the bring-up's own check cannot see (added to the command line behind its back)
    bring = Bringup("vehicle", domain_id=unique_domain_id(), log_dir=tmp_path, only=["controller"])
    bring.processes[0].command += ["-p", "perception.history_s:=1.0"]
    t0 = time.monotonic()
    with bring, pytest.raises(BringupError) as err:
        bring.wait_ready(timeout=60)
    seconds = time.monotonic() - t0
    print(f"failed start reported after {seconds:.1f} s")
    assert seconds < START_LIMIT_S, seconds
    assert _last_line(str(err.value)).startswith("[ControllerNode] failed to start"), str(err.value)[-2000:]
    assert "perception.history_s" in _last_line(str(err.value))


def test_a_value_that_cannot_take_effect_says_so(tmp_path):
    """Valid, but moot in this configuration: the planner starts and says which value has no effect."""
    code, _, out = _run("planner", ["-p", "planner.backend:=pytorch", "-p", "planner.device:=cpu",
                                    "-p", "runtime.onnx_dir:=/tmp/rad2_moot_onnx",
                                    "-p", "planner_node.max_stamp_skew_sim_s:=0.4"],
                        tmp_path, ready="planner ready")
    assert code is None, out[-3000:]
    for name in ("runtime.onnx_dir", "planner_node.max_stamp_skew_sim_s"):
        assert f"{name} = " in out and "has no effect" in out, out[-3000:]
    assert "planner.device = " not in out  # the pytorch backend does read it
