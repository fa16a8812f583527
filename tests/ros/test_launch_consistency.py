"""The launch files (ros2 launch, full installs) and rad2 graph up (this machine) start the same
executables, node names and parameter files: both read launch/graphs.yaml.

`launch`/`launch_ros` are not installable here, so the launch files are checked two ways: their AST
(each hands its own graph to the shared generator and names no executable itself), and by running
them against small stand-ins of the `launch` API that record the actions they build; the recorded
Node actions must equal the processes the bring-up tool starts.
"""

from __future__ import annotations

import ast
import importlib
import re
import sys
import types
from pathlib import Path

import pytest
import yaml
from rad2_bringup import graphs as rad2_graph

ROOT = Path(__file__).resolve().parents[2]
LAUNCH = ROOT / "launch"

LAUNCH_FILES = {
    "vehicle": "vehicle.launch.py",
    "simulation": "simulation.launch.py",
    "replay": "replay.launch.py",
}


def _console_scripts(package: str) -> dict[str, str]:
    """name -> 'module:function' from the package's setup.py (AST, no execution)."""
    setup = ROOT / "ros2_ws" / "src" / package / "setup.py"
    assert setup.is_file(), f"{setup} missing"
    scripts = {}
    for node in ast.walk(ast.parse(setup.read_text())):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            m = re.fullmatch(r"\s*([\w-]+)\s*=\s*([\w.]+:\w+)\s*", node.value)
            if m:
                scripts[m.group(1)] = m.group(2)
    return scripts


def test_graphs_cover_the_three_launch_files():
    assert set(rad2_graph.graph_names()) == set(LAUNCH_FILES)
    for graph in LAUNCH_FILES:
        spec = rad2_graph.load_graph(graph)
        assert spec.nodes, graph
        assert len({n.name for n in spec.nodes}) == len(spec.nodes), f"duplicate node names in {graph}"


@pytest.mark.parametrize("graph", sorted(LAUNCH_FILES))
def test_launch_file_ast_delegates_to_graphs_yaml(graph):
    tree = ast.parse((LAUNCH / LAUNCH_FILES[graph]).read_text())
    calls = [
        n for n in ast.walk(tree)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "generate"
    ]
    assert len(calls) == 1 and isinstance(calls[0].args[0], ast.Constant), "one generate('<graph>') call"
    assert calls[0].args[0].value == graph
    defs = [n.name for n in tree.body if isinstance(n, ast.FunctionDef)]
    assert "generate_launch_description" in defs
    # No node is named in the launch file itself: executables/param files come from graphs.yaml only.
    doc = yaml.safe_load((LAUNCH / "graphs.yaml").read_text())
    executables = {n["executable"] for n in doc["nodes"].values()}
    strings = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    assert not strings & executables, f"{LAUNCH_FILES[graph]} hard-codes {strings & executables}"
    assert not [s for s in strings if s.endswith(".yaml")], "parameter files must come from graphs.yaml"


def test_executables_components_and_param_files_exist():
    doc = yaml.safe_load((LAUNCH / "graphs.yaml").read_text())
    for key, node in doc["nodes"].items():
        scripts = _console_scripts(node["package"])
        assert node["executable"] in scripts, f"{key}: {node['executable']} not in {node['package']} setup.py"
        entry_module = scripts[node["executable"]].split(":")[0]
        comp_module, _, comp_class = node["component"].partition(":")
        assert comp_module == entry_module, f"{key}: component {comp_module} != entry point {entry_module}"
        src = ROOT / "ros2_ws" / "src" / node["package"] / (comp_module.replace(".", "/") + ".py")
        if src.is_file():  # nodes land one by one; once a module exists it must define the class
            classes = {n.name for n in ast.walk(ast.parse(src.read_text())) if isinstance(n, ast.ClassDef)}
            assert comp_class in classes, f"{src} defines no class {comp_class}"
        for pf in node["param_files"]:
            assert (ROOT / pf).is_file(), f"{key}: parameter file {pf} does not exist"


class _Recorder:
    """Stand-ins for the few `launch` / `launch_ros` classes the launch files use."""

    def __init__(self):
        self.nodes: list[dict] = []
        self.arguments: dict[str, dict] = {}
        self.processes: list[dict] = []

    def modules(self) -> dict[str, types.ModuleType]:
        rec = self
        launch = types.ModuleType("launch")
        actions = types.ModuleType("launch.actions")
        subst = types.ModuleType("launch.substitutions")
        launch_ros = types.ModuleType("launch_ros")
        ros_actions = types.ModuleType("launch_ros.actions")

        class LaunchDescription(list):
            pass

        class DeclareLaunchArgument:
            def __init__(self, name, default_value=None, description=""):
                rec.arguments[name] = {"default": default_value, "description": description}

        class ExecuteProcess:
            def __init__(self, cmd, **kw):
                rec.processes.append({"cmd": cmd, **kw})

        class LaunchConfiguration:
            def __init__(self, name):
                self.name = name

            def __eq__(self, other):
                return isinstance(other, LaunchConfiguration) and other.name == self.name

        class Node:
            def __init__(self, **kw):
                rec.nodes.append(kw)

        launch.LaunchDescription = LaunchDescription
        actions.DeclareLaunchArgument = DeclareLaunchArgument
        actions.ExecuteProcess = ExecuteProcess
        subst.LaunchConfiguration = LaunchConfiguration
        ros_actions.Node = Node
        launch.actions, launch.substitutions, launch_ros.actions = actions, subst, ros_actions
        return {"launch": launch, "launch.actions": actions, "launch.substitutions": subst,
                "launch_ros": launch_ros, "launch_ros.actions": ros_actions}


def _run_launch_file(graph: str, monkeypatch) -> _Recorder:
    rec = _Recorder()
    for name, mod in rec.modules().items():
        monkeypatch.setitem(sys.modules, name, mod)
    monkeypatch.delitem(sys.modules, "_rad2_launch", raising=False)
    path = LAUNCH / LAUNCH_FILES[graph]
    spec = importlib.util.spec_from_file_location(f"_launch_{graph}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.generate_launch_description()
    return rec


@pytest.mark.parametrize("graph", sorted(LAUNCH_FILES))
def test_launch_file_and_bringup_start_the_same_nodes(graph, monkeypatch):
    bringup = pytest.importorskip("rad2_bringup.bringup")
    rec = _run_launch_file(graph, monkeypatch)
    spec = rad2_graph.load_graph(graph)
    assert set(rec.arguments) >= set(spec.arguments)
    for name, arg in spec.arguments.items():
        assert rec.arguments[name]["default"] == arg.default

    defaults = {a.name: a.default for a in spec.arguments.values()}

    def resolve(value):  # LaunchConfiguration -> the argument's default, as ros2 launch would
        return rad2_graph.substitute(f"$(arg {value.name})", defaults) if hasattr(value, "name") else value

    launched = []
    for kw in rec.nodes:
        files = [p for p in kw["parameters"] if isinstance(p, str)]
        inline = {k: resolve(v) for p in kw["parameters"] if isinstance(p, dict) for k, v in p.items()}
        launched.append((kw["package"], kw["executable"], kw["name"], files, inline, dict(kw["remappings"])))

    started = []
    for n in spec.nodes:
        exe = bringup.executable_path(n.package, n.executable)
        ros_args = bringup.ros_args(n)
        files = [ros_args[i + 1] for i, a in enumerate(ros_args) if a == "--params-file"]
        started.append((n.package, exe.name, n.name, files, n.parameters, n.remappings))
        assert exe.parent == ROOT / "ros2_ws" / "install" / n.package / "lib" / n.package
        # the -p values on the command line are the graph's parameters, in YAML syntax
        p_args = [ros_args[i + 1] for i, a in enumerate(ros_args) if a == "-p"]
        parsed = {a.split(":=", 1)[0]: yaml.safe_load(a.split(":=", 1)[1]) for a in p_args}
        assert parsed == n.parameters
        assert f"__node:={n.name}" in ros_args
    assert launched == started


def test_replay_launch_adds_only_the_bag_player(monkeypatch):
    rec = _run_launch_file("replay", monkeypatch)
    assert len(rec.processes) == 1
    assert rec.processes[0]["cmd"][:3] == ["ros2", "bag", "play"]
    assert "bag" in rec.arguments


def test_graph_argument_substitution_and_errors():
    spec = rad2_graph.load_graph("vehicle", {"map_file": "data/eval_safety"})
    perception = next(n for n in spec.nodes if n.executable == "perception_node")
    assert perception.parameters["perception.map_file"] == "data/eval_safety"
    with pytest.raises(rad2_graph.GraphError, match="no argument 'nope'"):
        rad2_graph.load_graph("vehicle", {"nope": "1"})
    with pytest.raises(rad2_graph.GraphError, match="no graph"):
        rad2_graph.load_graph("does_not_exist")
    assert rad2_graph.substitute("$(arg n)", {"n": "3"}) == 3
    assert rad2_graph.substitute("x_$(arg n)", {"n": "3"}) == "x_3"


# A node whose callback fails, with or without rclpy's signal thread shutting the context down a moment
# later: the race behind a supervisor that once exited 1 on SIGINT (its message take failed while the
# interrupt was pending, and the context still read as up).
_FAILING_CALLBACK_NODE = """
import sys, threading, time
import rclpy
from rclpy.node import Node
from rad2_ros.nodes.common import run_node

SHUT_DOWN_AFTER_S = float(sys.argv[1])  # < 0: nobody shuts the context down

class FailingNode(Node):
    def __init__(self):
        super().__init__("failing_callback")
        self.create_timer(0.05, self.on_timer)

    def on_timer(self):
        if SHUT_DOWN_AFTER_S >= 0:
            threading.Timer(SHUT_DOWN_AFTER_S, rclpy.try_shutdown).start()
        raise RuntimeError("callback failed")

sys.exit(run_node(FailingNode))
"""


@pytest.mark.parametrize(("shutdown_after_s", "exit_code"), [(0.3, 0), (-1.0, 1)],
                         ids=["shutdown-follows", "genuine-fault"])
def test_a_callback_failing_as_the_context_shuts_down_is_a_clean_stop(shutdown_after_s, exit_code):
    """A failure followed within the grace period by the context's shutdown is the requested stop
    (exit 0); a failure with no shutdown behind it still ends the node with the error (exit 1)."""
    import subprocess

    from ros_process import require_ros_build, ros_env

    require_ros_build()
    proc = subprocess.run([sys.executable, "-c", _FAILING_CALLBACK_NODE, str(shutdown_after_s)],
                          env=ros_env(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == exit_code, proc.stderr[-2000:]
    if exit_code:
        assert "callback failed" in proc.stderr


@pytest.mark.parametrize("composed", [False, True], ids=["processes", "composed"])
def test_bringup_starts_the_graph_and_stops_cleanly(composed, tmp_path):
    """The vehicle graph comes up from graphs.yaml in both modes (readiness = every node visible in
    the ROS graph with its endpoints), logs land per process, and SIGINT ends everything with 0."""
    from ros_process import require_ros_build, unique_domain_id

    require_ros_build()
    from rad2_bringup import bringup

    overrides = {"planner": {"planner_node.random_init_if_missing": True, "planner.backend": "pytorch"}}
    b = bringup.Bringup("vehicle", domain_id=unique_domain_id(), log_dir=tmp_path, overrides=overrides,
                        composed=composed)
    with b:
        b.wait_ready(timeout=90)
        b.check_alive()
    codes = {p.name: p.returncode for p in b.processes}
    if not all(c == 0 for c in codes.values()):
        # the whole of each log (a hang's stacks, printed on SIGUSR1, run to many lines): pytest
        # shortens an assertion's explanation, not a fail() message
        pytest.fail(f"exit codes {codes}\n{b.tails(400)}", pytrace=False)
    expected = ["composed"] if composed else [n.name for n in rad2_graph.load_graph("vehicle").nodes]
    assert sorted(p.log_path.stem for p in b.processes) == sorted(expected)
    text = "".join(p.log_path.read_text() for p in b.processes)
    for name in ("bev_features", "planner", "controller"):
        assert f"[{name}]" in text, text[-2000:]
