"""Read launch/graphs.yaml: the one description of rad2's ROS graphs.

Used by the launch files in launch/ (``ros2 launch`` on a full ROS 2 install) and by
``rad2_bringup.bringup`` / ``rad2 graph up`` (separate processes or one composed process where
``launch`` is unavailable). Plain Python + PyYAML only (no ROS), so both can import it.

The file and the parameter files it names are looked up like every repository-relative resource
(``rad2_core.config.resource_path``): in the checkout, else in the installed ``share/rad2_bringup``
(setup.py installs launch/ and params/ there), so a build installed away from the checkout brings
its graphs up too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from rad2_core.config import resource_path

# the checkout's, else the installed package's (where neither has it, the checkout's path: the error names it)
GRAPHS_FILE = resource_path("launch/graphs.yaml", required=False)
_ARG_RE = re.compile(r"\$\(arg ([A-Za-z_][A-Za-z0-9_]*)\)")


class GraphError(ValueError):
    """graphs.yaml is malformed or a graph/argument does not exist."""


@dataclass(frozen=True)
class GraphArgument:
    name: str
    default: str
    description: str


@dataclass
class NodeSpec:
    """One node of a graph, everything needed to start it."""

    name: str  # ROS node name
    package: str
    executable: str  # console_scripts name, installed as install/<package>/lib/<package>/<executable>
    component: str  # "module:Class" used by the composed single-process mode
    param_files: list[str]  # repository-relative, applied in order
    parameters: dict[str, Any] = field(default_factory=dict)  # per-graph overrides (after arg substitution)
    remappings: dict[str, str] = field(default_factory=dict)

    def param_paths(self, root: Path | None = None) -> list[Path]:
        """The parameter files, under ``root`` when given, else found in the checkout or the installed
        package share (``resource_path``; a missing one raises ResourceNotFoundError naming both)."""
        if root is not None:
            return [Path(root) / p for p in self.param_files]
        return [resource_path(p) for p in self.param_files]


@dataclass
class GraphSpec:
    name: str
    description: str
    arguments: dict[str, GraphArgument]
    nodes: list[NodeSpec]


def _load(path: Path = GRAPHS_FILE) -> dict[str, Any]:
    with Path(path).open() as f:
        doc = yaml.safe_load(f)
    if not isinstance(doc, dict) or "nodes" not in doc or "graphs" not in doc:
        raise GraphError(f"{path}: expected top-level 'nodes' and 'graphs'")
    return doc


def graph_names(path: Path = GRAPHS_FILE) -> list[str]:
    return list(_load(path)["graphs"])


def substitute(value: Any, args: dict[str, str]) -> Any:
    """Replace ``$(arg NAME)`` in strings (recursively); a value that is exactly one substitution
    takes the argument's YAML type (e.g. "3" -> 3) like ROS parameter parsing does."""
    if isinstance(value, dict):
        return {k: substitute(v, args) for k, v in value.items()}
    if isinstance(value, list):
        return [substitute(v, args) for v in value]
    if not isinstance(value, str):
        return value

    def repl(m: re.Match) -> str:
        if m.group(1) not in args:
            raise GraphError(f"unknown graph argument {m.group(1)!r} (have {sorted(args)})")
        return str(args[m.group(1)])

    full = _ARG_RE.fullmatch(value)
    out = _ARG_RE.sub(repl, value)
    if full:
        parsed = yaml.safe_load(out) if out != "" else ""
        return parsed if isinstance(parsed, (bool, int, float, str)) else out
    return out


def load_graph(
    name: str, args: dict[str, str] | None = None, path: Path = GRAPHS_FILE, substitute_args: bool = True
) -> GraphSpec:
    """The graph ``name`` with its nodes resolved. ``args`` override the graph arguments' defaults.

    With ``substitute_args=False`` the ``$(arg X)`` strings are kept (the launch files turn them
    into LaunchConfiguration substitutions instead).
    """
    doc = _load(path)
    if name not in doc["graphs"]:
        raise GraphError(f"no graph {name!r} in {path} (have {sorted(doc['graphs'])})")
    g = doc["graphs"][name] or {}
    arguments = {
        k: GraphArgument(k, str(v.get("default", "")), str(v.get("description", "")))
        for k, v in (g.get("arguments") or {}).items()
    }
    values = {k: a.default for k, a in arguments.items()}
    for k, v in (args or {}).items():
        if k not in arguments:
            raise GraphError(f"graph {name!r} has no argument {k!r} (have {sorted(arguments)})")
        values[k] = str(v)
    nodes = []
    for entry in g.get("nodes") or []:
        key = entry["node"]
        if key not in doc["nodes"]:
            raise GraphError(f"graph {name!r} names unknown node {key!r}")
        base = doc["nodes"][key]
        params = dict(entry.get("parameters") or {})
        nodes.append(
            NodeSpec(
                name=entry.get("name", key),
                package=base["package"],
                executable=base["executable"],
                component=base["component"],
                param_files=list(base.get("param_files") or []) + list(entry.get("param_files") or []),
                parameters=substitute(params, values) if substitute_args else params,
                remappings=dict(entry.get("remappings") or {}),
            )
        )
    return GraphSpec(name, str(g.get("description", "")).strip(), arguments, nodes)


def describe_graphs(path: Path = GRAPHS_FILE) -> str:
    """Every graph with its nodes (package/executable, parameter files) and arguments, as text."""
    lines = []
    for name in graph_names(path):
        g = load_graph(name, path=path)
        lines.append(f"{name}: {g.description}")
        for n in g.nodes:
            lines.append(f"    {n.name:14s} {n.package}/{n.executable}  params: {', '.join(n.param_files)}")
        for a in g.arguments.values():
            lines.append(f"    arg {a.name} (default {a.default!r}): {a.description}")
    return "\n".join(lines)
