"""Bring up a rad2 ROS 2 graph without `ros2 launch`: the same executables, node names and parameter
files as launch/*.launch.py, all read from launch/graphs.yaml (``rad2_bringup.graphs``).

Two modes:
  processes (default)  one OS process per node (install/<pkg>/lib/<pkg>/<exe> --ros-args ...), each
                       with its own log file; a readiness check waits until every node is visible in
                       the ROS graph with its publishers/subscriptions; SIGINT, then SIGTERM, then
                       SIGKILL on shutdown.
  composed             every node of the graph in one process on a MultiThreadedExecutor
                       (``run_composed``; ``Bringup(composed=True)`` runs ``rad2 graph up --composed``).

The command is ``rad2 graph up`` (rad2_bringup.cli.graph_up). Imports rclpy only inside ``run_composed``.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rad2_ros.rosenv import REPO_ROOT, child_environment, ros_environment

from rad2_bringup import graphs

INSTALL = REPO_ROOT / "ros2_ws" / "install"
# Where the processes run and their logs go: the checkout, or the working directory of an install run
# away from it (which has no checkout to write into).
WORK_DIR = REPO_ROOT if (REPO_ROOT / "ros2_ws").is_dir() else Path.cwd()
# The command the composed mode runs as its one child process (argument handling lives there).
BRINGUP_COMMAND = ["-m", "rad2_bringup.cli", "graph", "up"]


class BringupError(RuntimeError):
    """A node could not be started, did not become ready, or died."""


def executable_path(package: str, executable: str, install: Path = INSTALL) -> Path:
    return install / package / "lib" / package / executable


def find_executable(package: str, executable: str) -> Path:
    """The checkout's ``ros2_ws/install/<pkg>/lib/<pkg>/<exe>``, else the one under the package's prefix
    in the ament index (a sourced install elsewhere, e.g. copied away from the checkout); the
    checkout's path when neither exists (what the error names)."""
    exe = executable_path(package, executable)
    if exe.exists():
        return exe
    try:
        from ament_index_python.packages import get_package_prefix

        installed = Path(get_package_prefix(package)) / "lib" / package / executable
    except (ImportError, LookupError, ValueError):
        return exe
    return installed if installed.exists() else exe


def param_arg(name: str, value: Any) -> str:
    """``name:=value`` with the value in YAML syntax (how ``-p`` parses it)."""
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, (int, float)):
        text = repr(value)
    elif isinstance(value, (list, tuple)):
        text = json.dumps(list(value))
    else:
        text = str(value)
        if text == "" or re.fullmatch(r"[-+.\d eE]+|true|false|null|~", text, re.I) or ":" in text:
            text = json.dumps(text)  # keep it a string
    return f"{name}:={text}"


# Parameters rclpy gives every node (not in any schema of params/).
ROS_NODE_PARAMETERS = {"use_sim_time": "bool"}


def resolve_overrides(spec: graphs.NodeSpec, overrides: dict[str, Any]) -> dict[str, Any]:
    """``overrides`` of node ``spec`` by full parameter name, each checked against the schemas of the
    node's parameter files before any process starts (a wrong key or type fails here, in a second,
    naming it, instead of in the node after the readiness timeout).

    A key that is no parameter of the files but is one once prefixed with the node's name is taken
    with it: ``--set planner.deadline_ms=80`` (node ``planner``, key ``deadline_ms``) sets
    ``planner.deadline_ms`` as ``planner.planner.deadline_ms=80`` does. An integer for a float
    parameter becomes that float (``-p`` would hand the node an INTEGER for a DOUBLE)."""
    from rad2_core.config import ParameterError, load_schema, value_problem

    schema: dict[str, Any] = {}
    for path in spec.param_paths(REPO_ROOT):
        schema.update(load_schema(path))
    out: dict[str, Any] = {}
    problems = []
    for key, value in overrides.items():
        name = key
        if name not in schema and name not in ROS_NODE_PARAMETERS and f"{spec.name}.{name}" in schema:
            name = f"{spec.name}.{name}"
        if name in ROS_NODE_PARAMETERS:
            if not isinstance(value, bool):
                problems.append(f"{key} = {value!r} is not a bool")
            out[name] = value
            continue
        entry = schema.get(name)
        if entry is None:
            import difflib

            near = difflib.get_close_matches(name, sorted(schema), n=3, cutoff=0.6)
            hint = f" (did you mean {', '.join(near)}?)" if near else ""
            problems.append(f"{key} is not a parameter of node {spec.name!r}: none of "
                            f"{', '.join(spec.param_files)} has it{hint}")
            continue
        if entry.type == "float" and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        elif (entry.type == "list" and entry.items == "float" and isinstance(value, list)
              and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)):
            value = [float(v) for v in value]
        problem = value_problem(entry, value)
        if problem:
            problems.append(f"{name} = {value!r} {problem}")
            continue
        out[name] = value
    if problems:
        raise ParameterError(f"node {spec.name!r}: " + "; ".join(problems))
    return out


def ros_args(spec: graphs.NodeSpec, overrides: dict[str, Any] | None = None) -> list[str]:
    """The ``--ros-args`` part of a node's command line: name, parameter files, -p, remaps."""
    args = ["--ros-args", "-r", f"__node:={spec.name}"]
    for path in spec.param_paths():
        args += ["--params-file", str(path)]
    for key, value in {**spec.parameters, **(overrides or {})}.items():
        args += ["-p", param_arg(key, value)]
    for src, dst in spec.remappings.items():
        args += ["-r", f"{src}:={dst}"]
    return args


def node_command(spec: graphs.NodeSpec, overrides: dict[str, Any] | None = None) -> list[str]:
    exe = find_executable(spec.package, spec.executable)
    if not exe.exists():
        raise BringupError(f"{exe} does not exist: build the workspace first (bash tools/bootstrap.sh)")
    return [str(exe), *ros_args(spec, overrides)]


@dataclass
class NodeProcess:
    spec: graphs.NodeSpec
    command: list[str]
    log_path: Path
    popen: subprocess.Popen | None = None
    log_file: Any = None
    returncode: int | None = None
    stop_seconds: float | None = None  # from the first SIGINT of stop() until the process was seen gone

    @property
    def name(self) -> str:
        return self.spec.name

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive():
            try:
                os.killpg(self.popen.pid, sig)
            except ProcessLookupError:
                pass

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


_PROBE = textwrap.dedent(
    """
    import json, sys, time
    import rclpy
    expected = set(json.loads(sys.argv[1])); deadline = time.monotonic() + float(sys.argv[2])
    # endpoints every node has (rclpy's logging, parameter events, the /clock of use_sim_time): a node
    # is ready once it has created one of its own
    SYSTEM = ("/rosout", "/parameter_events", "/clock")
    rclpy.init()
    node = rclpy.create_node("_rad2_bringup_probe")
    ready = set()
    try:
        while time.monotonic() < deadline:
            names = {n for n, _ in node.get_node_names_and_namespaces()}
            for name in expected & names - ready:
                ns = dict(node.get_node_names_and_namespaces())[name]
                pubs = node.get_publisher_names_and_types_by_node(name, ns)
                subs = node.get_subscriber_names_and_types_by_node(name, ns)
                if [t for t, _ in pubs + subs if t not in SYSTEM]:
                    ready.add(name)
            if ready == expected:
                break
            time.sleep(0.1)
    finally:
        print(json.dumps(sorted(ready)), flush=True)
        node.destroy_node(); rclpy.try_shutdown()
    """
)


@dataclass
class Bringup:
    """Start a graph of launch/graphs.yaml as processes; use as a context manager.

    ``overrides`` maps node name -> {parameter: value} (applied after the graph's own -p values);
    ``extra_env`` is added to every process's environment (after the ROS environment).
    """

    graph: str
    args: dict[str, str] = field(default_factory=dict)
    domain_id: int = 0
    log_dir: Path | None = None
    overrides: dict[str, dict[str, Any]] = field(default_factory=dict)
    extra_env: dict[str, str] = field(default_factory=dict)
    composed: bool = False
    only: list[str] | None = None  # start only these node names (others may run elsewhere)
    wrap: list[str] | None = None  # command prefix, e.g. ["ip", "netns", "exec", "hostA"]

    def __post_init__(self) -> None:
        from rad2_core.config import ParameterError

        self.spec = graphs.load_graph(self.graph, self.args)
        known = {n.name for n in self.spec.nodes}
        for name in list(self.overrides) + list(self.only or []):
            if name not in known:
                raise BringupError(f"graph {self.graph!r} has no node {name!r} (have {sorted(known)})")
        try:
            for n in self.spec.nodes:
                n.parameters = resolve_overrides(n, n.parameters)
            self.overrides = {name: resolve_overrides(next(n for n in self.spec.nodes if n.name == name),
                                                      params)
                              for name, params in self.overrides.items()}
        except ParameterError as exc:
            raise BringupError(str(exc)) from None
        if self.log_dir is None:
            self.log_dir = WORK_DIR / "runs" / "bringup" / time.strftime(f"{self.graph}-%Y%m%d-%H%M%S")
        self.log_dir = Path(self.log_dir)
        self.env = {**ros_environment(self.domain_id), "PYTHONUNBUFFERED": "1", **self.extra_env}
        nodes = [n for n in self.spec.nodes if self.only is None or n.name in self.only]
        if self.composed:
            cmd = [sys.executable, *BRINGUP_COMMAND, self.graph, "--composed", "--foreground",
                   "--domain-id", str(self.domain_id)]
            for k, v in self.args.items():
                cmd += ["--arg", f"{k}={v}"]
            for node_name, params in self.overrides.items():
                for k, v in params.items():
                    cmd += ["--set", param_arg(f"{node_name}.{k}", v).replace(":=", "=", 1)]
            for name in self.only or []:
                cmd += ["--only", name]
            composite = graphs.NodeSpec("composed", "", "", "", [])
            self.processes = [NodeProcess(composite, cmd, self.log_dir / "composed.log")]
        else:
            self.processes = [
                NodeProcess(n, node_command(n, self.overrides.get(n.name)), self.log_dir / f"{n.name}.log")
                for n in nodes
            ]
        if self.wrap:
            for proc in self.processes:
                proc.command = [*self.wrap, *proc.command]
        self.node_names = [n.name for n in nodes]

    # -- lifecycle ---------------------------------------------------------------------------------
    def start(self) -> Bringup:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        for proc in self.processes:
            proc.log_file = proc.log_path.open("w")
            proc.log_file.write("$ " + " ".join(proc.command) + "\n")
            proc.log_file.flush()
            proc.popen = subprocess.Popen(
                proc.command, cwd=WORK_DIR, env=child_environment(self.env), stdout=proc.log_file,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True,
            )
        return self

    def wait_ready(self, timeout: float = 60.0) -> float:
        """Block until every node is in the ROS graph with its endpoints; returns the seconds taken.

        A node process that exits meanwhile (a parameter refused at start, a missing checkpoint) ends
        the wait at once with its log's tail, the node's own error last."""
        t0 = time.monotonic()
        probe = subprocess.Popen(
            [*(self.wrap or []), sys.executable, "-c", _PROBE, json.dumps(self.node_names), str(timeout)],
            env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        try:
            while probe.poll() is None:
                if time.monotonic() - t0 > timeout + 30:
                    raise BringupError(f"readiness probe did not end within {timeout + 30:.0f} s")
                self.check_alive()
                time.sleep(0.1)
        finally:
            if probe.poll() is None:
                probe.kill()
            out, err = probe.communicate()
        self.check_alive()
        try:
            ready = set(json.loads(out.strip().splitlines()[-1]))
        except (IndexError, json.JSONDecodeError) as exc:
            raise BringupError(f"readiness probe failed: {err[-2000:]}") from exc
        missing = set(self.node_names) - ready
        if missing:
            raise BringupError(f"nodes not ready after {timeout:.0f} s: {sorted(missing)}\n{self.tails()}")
        return time.monotonic() - t0

    def check_alive(self) -> None:
        dead = [p for p in self.processes if p.popen is not None and p.popen.poll() is not None]
        if dead:
            # the dead processes' logs last, so their own final line (the start-up error) ends the text
            alive = [p for p in self.processes if p not in dead]
            tails = "\n".join(f"--- {p.log_path}\n{p.log_tail(20)}" for p in alive + dead)
            raise BringupError(
                "process exited: " + ", ".join(f"{p.name} (rc={p.popen.returncode})" for p in dead)
                + "\n" + tails
            )

    def process(self, name: str) -> NodeProcess:
        for p in self.processes:
            if p.name == name:
                return p
        raise KeyError(name)

    def tails(self, lines: int = 20) -> str:
        return "\n".join(f"--- {p.log_path}\n{p.log_tail(lines)}" for p in self.processes)

    def stop(self, timeout: float = 10.0) -> dict[str, int | None]:
        """SIGINT every process, then SIGTERM, then SIGKILL; returns name -> return code. Each
        process's ``stop_seconds`` records how long it took to go."""
        t0 = time.monotonic()

        def note_exits() -> bool:
            alive = False
            for p in self.processes:
                if p.alive():
                    alive = True
                elif p.stop_seconds is None:
                    p.stop_seconds = time.monotonic() - t0
            return alive

        for sig, wait in ((signal.SIGINT, timeout), (signal.SIGTERM, 3.0), (signal.SIGKILL, 3.0)):
            if sig != signal.SIGINT and note_exits():
                # a process that ignored the previous signal first prints its threads' stacks into
                # its log (every graph node registers faulthandler on SIGUSR1): a hang must say where
                for p in self.processes:
                    p.signal(signal.SIGUSR1)
                time.sleep(0.5)
            for p in self.processes:
                p.signal(sig)
            end = time.monotonic() + wait
            while time.monotonic() < end and note_exits():
                time.sleep(0.05)
        for p in self.processes:
            if p.popen is not None:
                try:
                    p.returncode = p.popen.wait(timeout=1.0)
                except subprocess.TimeoutExpired:
                    p.returncode = None
            if p.log_file is not None and not p.log_file.closed:
                p.log_file.close()
        note_exits()
        return {p.name: p.returncode for p in self.processes}

    def run(self, ready_timeout: float = 60.0, duration: float | None = None) -> int:
        """Start, wait until ready, then watch the processes until SIGINT/SIGTERM or ``duration``
        seconds; stop everything. Returns 0, or 1 when a node did not come up or died."""
        stop = {"flag": False}
        signal.signal(signal.SIGINT, lambda *_: stop.update(flag=True))
        signal.signal(signal.SIGTERM, lambda *_: stop.update(flag=True))
        self.start()
        started = ", ".join(f"{p.name} (pid {p.popen.pid})" for p in self.processes)
        print(f"[bringup] {self.graph}: started {started}; logs in {self.log_dir}", flush=True)
        rc = 0
        try:
            took = self.wait_ready(ready_timeout)
            print(f"[bringup] all nodes ready in {took:.1f} s: {', '.join(self.node_names)}", flush=True)
            end = None if duration is None else time.monotonic() + duration
            while not stop["flag"] and (end is None or time.monotonic() < end):
                self.check_alive()
                time.sleep(0.2)
        except BringupError as exc:
            print(f"bringup: {exc}", file=sys.stderr)
            rc = 1
        codes = self.stop()
        print(f"[bringup] stopped: {codes}", flush=True)
        return rc

    def __enter__(self) -> Bringup:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


# -- composed mode (one process) -------------------------------------------------------------------
def load_component(path: str):
    module, _, cls = path.partition(":")
    return getattr(importlib.import_module(module), cls)


def run_composed(graph: str, args: dict[str, str], overrides: dict[str, dict[str, Any]], domain_id: int,
                 duration: float | None, only: list[str] | None = None, threads: int | None = None) -> int:
    """Every node of ``graph`` in this process on one MultiThreadedExecutor until SIGINT/duration.

    Each node gets its own ``--ros-args`` (name, parameter files, -p, remaps) through ``cli_args``,
    exactly the arguments the separate-process mode passes on the command line. Start, spin and
    teardown are those of a node process (``nodes.common.run_nodes``: stop handlers, spin slices, a
    teardown watchdog that prints the stacks of a hang).
    """
    os.environ.update(ros_environment(domain_id))
    from rad2_ros.nodes.common import run_nodes
    from rclpy.executors import MultiThreadedExecutor

    spec = graphs.load_graph(graph, args)
    factories = [
        (lambda n=n: load_component(n.component)(cli_args=ros_args(n, overrides.get(n.name))))
        for n in spec.nodes if not only or n.name in only
    ]

    def announce(nodes) -> None:
        print(f"[bringup] composed {graph}: {[n.get_name() for n in nodes]} on one "
              f"MultiThreadedExecutor", flush=True)

    return run_nodes(factories, executor_factory=lambda: MultiThreadedExecutor(num_threads=threads),
                     duration=duration, on_started=announce, label=f"composed {graph}")
