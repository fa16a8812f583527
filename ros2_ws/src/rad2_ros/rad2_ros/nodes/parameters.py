"""ROS parameters of the rad2 nodes, declared from the parameter files and their schemas.

``declare_parameters`` declares every value of the ``ros__parameters`` blocks of a node's
params/*.yaml files as a ROS parameter, with the description, unit, range, choices and read-only flag
of its schema entry (``params/<name>.schema.yaml``), and returns the effective values (after
``--params-file`` / ``-p`` overrides, checked against the schema: an unknown key or a wrong type is a
ParameterError at start naming the key) as the nested dict the core takes. The YAML files stay the only
source of values and the schemas the only source of descriptors.
"""

from __future__ import annotations

import difflib
import fnmatch
import math
import sys
from dataclasses import dataclass
from typing import Any

import yaml
from rad2_core.config import ParameterError, ParamSchema, load_params, load_schema, value_problem
from rcl_interfaces.msg import FloatingPointRange, IntegerRange, ParameterDescriptor
from rclpy.node import Node

# --------------------------------------------------------------------------------------------------
# Parameters
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeParameter:
    """One parameter a node takes from a params/*.yaml file: its YAML value (as a ROS value), the file
    it comes from and its schema entry (``params/<file>.schema.yaml``)."""

    name: str
    value: Any
    source: str
    spec: ParamSchema

    @property
    def declarable(self) -> bool:
        """Whether ROS can hold it (not a null, an empty list or a list of lists / mappings): the others
        reach the node from the YAML only."""
        value = self.value
        return value is not None and not (
            isinstance(value, list) and (not value or any(isinstance(v, (list, dict)) for v in value))
        )


def _flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(_flatten(value, name + "."))
        else:
            out[name] = value
    return out


def _nest(flat: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, value in flat.items():
        node = out
        parts = name.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    return out


def _descriptor(param: NodeParameter) -> ParameterDescriptor:
    """The ROS descriptor of a parameter, all from its schema entry: description (with the unit),
    read-only flag, range (as a ROS range for a numeric scalar, in words for list elements), choices."""
    spec, value = param.spec, param.value
    text = spec.description
    if spec.unit not in ("-", "1"):  # no unit (strings, flags) / a plain count
        text += ("" if text.endswith(".") else ".") + f" Unit: {spec.unit}."
    desc = ParameterDescriptor(name=param.name, description=text, read_only=spec.read_only)
    constraints = []
    if spec.min is not None or spec.max is not None:
        lo = spec.min if spec.min is not None else -math.inf
        hi = spec.max if spec.max is not None else math.inf
        # The ROS range follows the declared value's type: a float parameter written as an int in the
        # YAML is an integer parameter to ROS (the type of the default decides).
        if isinstance(value, bool):
            pass
        elif isinstance(value, int):
            big = 2**62
            desc.integer_range = [
                IntegerRange(from_value=int(max(lo, -big)), to_value=int(min(hi, big)), step=0)
            ]
        elif isinstance(value, float):
            desc.floating_point_range = [
                FloatingPointRange(from_value=float(lo), to_value=float(hi), step=0.0)
            ]
        constraints.append(("each element in " if spec.type == "list" else "range ") + f"[{lo}, {hi}]")
    if spec.choices is not None:
        constraints.append(f"one of {list(spec.choices)}")
    if spec.length is not None:
        constraints.append(f"{spec.length} elements")
    desc.additional_constraints = "; ".join(constraints)
    return desc


def _ros_value(value: Any) -> Any:
    """YAML values as ROS parameter values (homogeneous arrays; ints in float arrays become floats)."""
    if isinstance(value, (list, tuple)):
        items = list(value)
        if items and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in items):
            if any(isinstance(v, float) for v in items):
                return [float(v) for v in items]
        return items
    return value


def _plain(value: Any) -> Any:
    """A ROS parameter value as the YAML would hold it (rclpy may hand arrays out as array.array)."""
    if isinstance(value, (str, bytes)) or not hasattr(value, "__len__"):
        return value
    return list(value)


def node_parameters(
    files: list[str], node_block: str | None = None, prefixes: tuple[str, ...] | None = None
) -> dict[str, NodeParameter]:
    """Every parameter ``declare_parameters`` gives a node for the same arguments, by dotted name, with
    its schema entry; no ROS involved (tests walk the nodes' parameters through this)."""
    table: dict[str, NodeParameter] = {}
    for f in files:
        blocks = [load_params(f)] if node_block is None else []
        if node_block is not None:
            for key in (None, node_block):
                try:
                    blocks.append(load_params(f, node=key))
                except ParameterError:
                    pass
        source = f if str(f).endswith(".yaml") else f"params/{f}.yaml"
        schema = load_schema(f)
        for block in blocks:
            for name, value in _flatten(block).items():
                if prefixes is not None and name.split(".")[0] not in prefixes:
                    continue
                # load_params has checked every key of the block against this schema: all are in it
                table[name] = NodeParameter(name, _ros_value(value), source, schema[name])
    return table


# Parameters every rclpy node has (declared by rclpy itself, or on demand for QoS overrides).
ROS_BUILTIN_PARAMETERS = frozenset({"use_sim_time", "start_type_description_service"})
ROS_BUILTIN_PREFIXES = ("qos_overrides.",)
_SKIP_VALUE_OPTIONS = {"-r", "--remap", "-e", "--enclave", "--log-level", "--log-config-file",
                       "--log-file-name"}


def _node_block(key: str, node_name: str) -> str | None:
    """"node" when a params-file block key addresses ``node_name`` by name (``planner``, ``/planner``,
    ``/**/planner``), "all" for the wildcard blocks (``/**``, ``**``), None otherwise."""
    key = str(key)
    if key.strip("/") in ("**", "*"):
        return "all"
    if fnmatch.fnmatchcase("/" + node_name, "/" + key.lstrip("/")):
        return "node"
    return None


def explicit_overrides(args: list[str], node_name: str,
                       given: dict[str, Any] | None = None) -> dict[str, str]:
    """Parameter names given to ``node_name`` by name in ROS arguments, with where: ``-p NAME:=V`` /
    ``--param`` (also ``-p node:NAME:=V`` for this node) and the keys of ``--params-file`` blocks
    addressed to this node (not the wildcard ``/**`` blocks, which several nodes share). Every value
    that applies to this node (``-p``, and the files' wildcard and node blocks) goes into ``given`` as
    (value, where), the later one winning as in rcl (``-p`` values parsed as YAML, as rcl does)."""
    out: dict[str, str] = {}
    given = {} if given is None else given
    inside = False
    i = 0
    while i < len(args):
        tok = str(args[i])
        if tok == "--ros-args":
            inside = True
        elif tok == "--":
            inside = False
        elif inside and tok in ("-p", "--param") and i + 1 < len(args):
            name = str(args[i + 1]).split(":=", 1)[0]
            if ":" in name:
                target, _, name = name.rpartition(":")
                if _node_block(target, node_name) is None:
                    name = ""
            if name:
                out[name] = f"-p {args[i + 1]}"
                text = str(args[i + 1]).split(":=", 1)[1] if ":=" in str(args[i + 1]) else ""
                try:
                    given[name] = (yaml.safe_load(text), out[name])  # how rcl parses a -p value
                except yaml.YAMLError:
                    given[name] = (text, out[name])
            i += 1
        elif inside and tok == "--params-file" and i + 1 < len(args):
            path = str(args[i + 1])
            try:
                with open(path) as f:
                    doc = yaml.safe_load(f) or {}
            except (OSError, yaml.YAMLError):
                doc = {}  # rcl itself refuses an unreadable file before the node exists
            for key, block in (doc.items() if isinstance(doc, dict) else []):
                params = block.get("ros__parameters") if isinstance(block, dict) else None
                scope = _node_block(key, node_name)
                if scope is None or not isinstance(params, dict):
                    continue
                for name, value in _flatten(params).items():
                    given[name] = (value, path)
                    if scope == "node":
                        out[name] = f"{path} (block {key!r})"
            i += 1
        elif inside and tok in _SKIP_VALUE_OPTIONS:
            i += 1
        i += 1
    return out


def _coerce_override(node: Node, param: NodeParameter) -> None:
    """An integer given for a float parameter (``-p planner.deadline_ms:=80``, a YAML ``80``) taken as
    that float, as the schema allows; rclpy would refuse it as the wrong type."""
    from rclpy.parameter import Parameter

    given = node._parameter_overrides.get(param.name)
    if given is None:
        return
    value = given.value
    spec = param.spec
    if spec.type == "float" and isinstance(value, int) and not isinstance(value, bool):
        node._parameter_overrides[param.name] = Parameter(param.name, value=float(value))
    elif (spec.type == "list" and spec.items == "float" and isinstance(value, (list, tuple))
          and value and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)):
        node._parameter_overrides[param.name] = Parameter(param.name, value=[float(v) for v in value])


def _apply_command_line(node: Node, table: dict[str, NodeParameter], given: dict[str, Any]) -> None:
    """Hold every value given to a parameter of this node (``-p``, parameter files) to its schema, and
    make it the override.

    rcl drops a value whose type differs from the one an earlier ``--params-file`` gave the same name
    (``-p controller.node.rate_hz:=abc`` after controller.yaml left 30.0 in force, without a word), so
    the node reads its arguments itself: a value of the wrong type raises ParameterError naming the
    key, a valid one (an integer for a float included) replaces whatever rcl kept."""
    from rclpy.parameter import Parameter

    for name, (value, where) in given.items():
        param = table.get(name)
        if param is None or not param.declarable:
            continue  # check_overrides has refused these
        spec = param.spec
        if spec.type == "float" and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        elif (spec.type == "list" and spec.items == "float" and isinstance(value, list)
              and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)):
            value = [float(v) for v in value]
        problem = value_problem(spec, value)
        if problem:
            raise ParameterError(f"{where}: {name} = {value!r} {problem} "
                                 f"(expected a {_type_text(spec)})")
        node._parameter_overrides[name] = Parameter(name, value=_ros_value(value))


def _type_text(spec: ParamSchema) -> str:
    kind = spec.type if spec.items is None else f"list of {spec.items}"
    bounds = f" in {spec.range_text()}" if spec.numeric else ""
    choices = f" one of {list(spec.choices)}" if spec.choices is not None else ""
    return f"{kind}{bounds}{choices}"


def check_overrides(node: Node, table: dict[str, NodeParameter], files: list[str],
                    explicit: dict[str, str]) -> None:
    """Refuse every override the node would otherwise ignore in silence: a name that is no parameter of
    this node (a typo, another node's parameter given to it by name, a key of a params file that no
    schema of its files knows) and a YAML-only value (a nested list, an empty list, a null) given as a
    ROS parameter. One ParameterError names every such key, where it was given and the nearest names."""
    known_in_files: set[str] = set()
    for f in files:
        known_in_files.update(load_schema(f))
    mine = sorted(table)
    problems = []
    for name, given in sorted(node._parameter_overrides.items()):
        if name in ROS_BUILTIN_PARAMETERS or name.startswith(ROS_BUILTIN_PREFIXES):
            continue
        param = table.get(name)
        if param is not None:
            if not param.declarable:
                problems.append(f"{name} (given as {given.value!r}) cannot be overridden as a ROS parameter "
                                f"(a null, an empty list or a list of lists): edit {param.source}")
            continue
        if node.has_parameter(name):
            continue
        if name in explicit or name not in known_in_files:
            where = explicit.get(name, "a parameter file")
            near = difflib.get_close_matches(name, mine, n=3, cutoff=0.6)
            hint = f"; did you mean {', '.join(near)}?" if near else ""
            problems.append(f"{name} (given as {given.value!r} by {where}) is not a parameter of node "
                            f"{node.get_name()!r} (its parameters come from "
                            f"{', '.join(map(str, files))}){hint}")
    if problems:
        raise ParameterError(f"node {node.get_name()!r}: " + "; ".join(problems))


class ParamValues(dict):
    """The nested parameter values of a node, plus ``overridden``: dotted name -> value of those whose
    value differs from the parameter files' (given with ``-p`` or another ``--params-file``)."""

    overridden: dict[str, Any]


def declare_parameters(
    node: Node,
    files: list[str],
    node_block: str | None = None,
    prefixes: tuple[str, ...] | None = None,
    cli_args: list[str] | None = None,
) -> ParamValues:
    """Declare every parameter of ``files`` (names like ``"planner"`` or paths) on ``node`` and return
    the effective values, nested like ``load_params`` returns them.

    ``node_block``: also read the file's block for this node name (e.g. ``planner:`` in a shared
    file) when present. ``prefixes``: declare only names under these top-level keys (a shared file
    holds other nodes' values too). Descriptors (description, unit, range, choices, read-only) come
    from the files' schemas (``params/<name>.schema.yaml``), the one place they are written; values
    given with ``--params-file`` / ``-p`` are checked against the same schema (ROS enforces the
    numeric range of scalars itself; this adds choices, list elements and lengths) and a bad one
    raises ``ParameterError`` naming file, key and value. An integer for a float parameter is taken as
    that float; a value of another type, and a name that is no parameter of this node
    (``check_overrides``), raise ``ParameterError`` naming the key: nothing given is ignored.
    ``cli_args``: the node's own ROS arguments (composed mode), read with the process's to tell
    names given to this node from a shared file's wildcard block.
    Parameters that cannot be ROS parameters (nested lists, empty lists, nulls) are kept in the
    returned dict from the YAML but not declared.
    """
    from rclpy.exceptions import InvalidParameterTypeException, InvalidParameterValueException

    values: dict[str, Any] = {}
    overridden: dict[str, Any] = {}
    table = node_parameters(files, node_block, prefixes)
    given: dict[str, Any] = {}
    explicit = explicit_overrides([*sys.argv, *(cli_args or [])], node.get_name(), given)
    check_overrides(node, table, files, explicit)
    _apply_command_line(node, table, given)
    for name, param in table.items():
        if not param.declarable:
            values[name] = param.value
            continue
        if node.has_parameter(name):
            values[name] = node.get_parameter(name).value
            continue
        _coerce_override(node, param)
        try:
            value = node.declare_parameter(name, param.value, _descriptor(param)).value
        except (InvalidParameterTypeException, InvalidParameterValueException):
            given = node._parameter_overrides.get(name)
            shown = given.value if given is not None else "?"
            problem = value_problem(param.spec, _plain(shown)) or "is refused by ROS"
            raise ParameterError(f"{param.source} (override): {name} = {shown!r} {problem} "
                                 f"(expected a {_type_text(param.spec)})") from None
        if _plain(value) != param.value:
            problem = value_problem(param.spec, _plain(value))
            if problem:
                raise ParameterError(f"{param.source} (override): {name} = {_plain(value)!r} {problem}")
            overridden[name] = _plain(value)
        values[name] = value
    out = ParamValues(_nest(values))
    out.overridden = overridden
    return out


