"""Read the project's parameter files (params/*.yaml), the one source of truth for every value.

Each file is a ROS 2 parameter file (``<node or /**>: ros__parameters: {...}``) so nodes can take it
with ``--ros-args --params-file``; the core reads the same ``ros__parameters`` block through here.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml


class ParameterError(ValueError):
    """A parameter file is missing, malformed, or lacks a required value."""


def params_dir() -> Path:
    """The params/ directory: $RAD2_PARAMS_DIR if set, else the repository's params/."""
    env = os.environ.get("RAD2_PARAMS_DIR")
    if env:
        return Path(env)
    here = Path(__file__).resolve()
    for parent in here.parents:
        candidate = parent / "params"
        if (candidate / "bev.yaml").is_file():
            return candidate
    raise ParameterError(
        "cannot find the params/ directory above %s; set RAD2_PARAMS_DIR" % here
    )


def _nest_dotted(flat: dict[str, Any]) -> dict[str, Any]:
    """Turn {'a.b': 1} into {'a': {'b': 1}} (ROS allows both spellings in YAML)."""
    out: dict[str, Any] = {}
    for key, value in flat.items():
        if isinstance(value, dict):
            value = _nest_dotted(value)
        node = out
        parts = str(key).split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        if isinstance(value, dict) and isinstance(node.get(parts[-1]), dict):
            node[parts[-1]].update(value)
        else:
            node[parts[-1]] = value
    return out


def load_params(name: str | os.PathLike, node: str | None = None) -> dict[str, Any]:
    """Load the ``ros__parameters`` block of ``params/<name>.yaml`` (or a path) as a nested dict.

    ``node`` picks a node-specific block; by default the wildcard ``/**`` block, or the only block.
    """
    path = Path(name)
    if path.suffix not in (".yaml", ".yml"):
        path = params_dir() / f"{name}.yaml"
    if not path.is_file():
        raise ParameterError(f"parameter file {path} does not exist")
    with path.open() as f:
        doc = yaml.safe_load(f)
    if not isinstance(doc, dict) or not doc:
        raise ParameterError(f"{path}: expected a mapping of node names to ros__parameters")
    if node is not None:
        key = node if node in doc else "/" + node.lstrip("/")
        if key not in doc:
            raise ParameterError(f"{path}: no block for node {node!r} (have {sorted(doc)})")
    elif "/**" in doc:
        key = "/**"
    elif len(doc) == 1:
        key = next(iter(doc))
    else:
        raise ParameterError(f"{path}: several node blocks {sorted(doc)}; pass node=")
    block = doc[key]
    if not isinstance(block, dict) or "ros__parameters" not in block:
        raise ParameterError(f"{path}: block {key!r} has no ros__parameters")
    return _nest_dotted(block["ros__parameters"] or {})


def require(params: dict[str, Any], dotted: str) -> Any:
    """Fetch ``a.b.c`` from a nested params dict, with an error naming the missing key."""
    node: Any = params
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            raise ParameterError(f"missing parameter {dotted!r}")
        node = node[part]
    return node


_DEFAULTS: dict[str, dict[str, Any]] = {}


def default_params(name: str) -> dict[str, Any]:
    """``load_params(name)`` read once per process and shared: treat it as read-only."""
    if name not in _DEFAULTS:
        _DEFAULTS[name] = load_params(name)
    return _DEFAULTS[name]


def cached_config(
    cache: dict[str, Any], params: dict[str, Any] | None, block: str, build, default: str
) -> Any:
    """``build(params)`` cached in ``cache`` by the content of the ``block`` block of ``params``
    (None = ``params/<default>.yaml``); the cache is emptied past 16 entries."""
    if params is None:
        params = default_params(default)
    key = repr(params.get(block))
    cfg = cache.get(key)
    if cfg is None:
        cfg = build(params)
        if len(cache) > 16:
            cache.clear()
        cache[key] = cfg
    return cfg


def parse_node_overrides(items: list[str]) -> dict[str, dict[str, Any]]:
    """``--set NODE.PARAM=VALUE`` items (tools/bringup.py, demo.py, replay_eval.py) -> {node: {param: value}}.

    PARAM may itself be dotted (``planner.planner.deadline_ms=80`` sets ``planner.deadline_ms`` of node
    ``planner``); VALUE is parsed as YAML, the way ``-p`` values are, with an empty VALUE kept as "".
    """
    out: dict[str, dict[str, Any]] = {}
    for item in items:
        key, sep, value = item.partition("=")
        node, _, param = key.strip().partition(".")
        if not sep or not node or not param:
            raise ParameterError(
                f"--set {item!r}: expected NODE.PARAM=VALUE (e.g. planner.planner.deadline_ms=80)")
        out.setdefault(node, {})[param] = yaml.safe_load(value) if value != "" else ""
    return out
