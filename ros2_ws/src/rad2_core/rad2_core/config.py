"""Read the project's parameter files (params/*.yaml), the one source of truth for every value.

Each file is a ROS 2 parameter file (``<node or /**>: ros__parameters: {...}``) so nodes can take it
with ``--ros-args --params-file``; the core reads the same ``ros__parameters`` block through here.

Beside each ``params/<name>.yaml`` lies ``params/<name>.schema.yaml``: for every dotted parameter name
its type, unit, description, range and (for enumerations) choices. ``load_params`` checks a file
against its schema (a wrong type, an out-of-range value, an unknown or a missing key fails at load,
naming file, key and value): every file of params/ must have one, a file elsewhere is checked when a
schema of its name exists. ``validate_overrides`` checks ``--set`` / ROS overrides the same way, and
the ROS nodes take their parameter descriptors (description, unit, range, choices, read-only) from
the same schemas (``rad2_ros.nodes.parameters.declare_parameters``).

``params_dir`` finds the directory: ``$RAD2_PARAMS_DIR``, else the ``params/`` of the source tree this
module lives in (a checkout, or a ``--symlink-install`` build, whose modules are the checkout's), else
``share/rad2_bringup/params`` of the installed package through the ament index (a build without
``--symlink-install`` run away from the checkout; ``setup.py`` installs params/*.yaml there).
``resource_path`` resolves the other repository-relative paths the same way (the shipped checkpoints
and the bundled evaluation data, which ``setup.py`` installs beside params/), and ``writable_dir``
sends caches that would go into a read-only install to the user's cache directory.

The files are read at the entry points only (the ROS nodes, the ``rad2`` verbs, the bring-up, demo
and harness mains, test fixtures): ``load_all`` there, then the dicts (or typed configs built from
them) go down as arguments; a library never calls a loader of this module, so one run uses one set of
values (``tests/unit/test_config_boundaries.py`` holds the libraries to that).

The checker is this module's own rather than ``jsonschema``: the schemas are flat dotted names with
units, ranges and read-only flags that also become the ROS parameter descriptors, and its messages
name file, key and value in one line, which jsonschema's errors would need translating back into.
"""

from __future__ import annotations

import hashlib
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml


class ParameterError(ValueError):
    """A parameter file is missing, malformed, or lacks a required value."""


PACKAGE = "rad2_bringup"


def _source_params_dir(start: Path) -> Path | None:
    """The ``params/`` above ``start`` (this module's real path: in a checkout or a symlink install),
    or None when ``start`` lies in no source tree."""
    for parent in start.parents:
        candidate = parent / "params"
        if (candidate / "bev.yaml").is_file():
            return candidate
    return None


def _installed_share() -> Path | None:
    """``share/rad2_bringup`` of the installed package (ament index, i.e. $AMENT_PREFIX_PATH), or None
    without ament_index_python or without the package in the index."""
    try:
        from ament_index_python.packages import PackageNotFoundError, get_package_share_directory
    except ImportError:  # the core runs without ROS too (training, offline tools)
        return None
    try:
        return Path(get_package_share_directory(PACKAGE))
    except (PackageNotFoundError, ValueError, OSError):  # OSError: AMENT_PREFIX_PATH unset or empty
        return None


def _installed_params_dir() -> Path | None:
    """``share/rad2_bringup/params`` of the installed package, or None without the files."""
    share = _installed_share()
    candidate = share / "params" if share is not None else None
    return candidate if candidate is not None and (candidate / "bev.yaml").is_file() else None


def params_dir() -> Path:
    """The params/ directory: $RAD2_PARAMS_DIR if set, else the source tree's params/ (looked up from
    this file, so edits to params/ apply without a rebuild), else the installed
    ``share/rad2_bringup/params`` found through the ament index."""
    env = os.environ.get("RAD2_PARAMS_DIR")
    if env:
        return Path(env)
    here = Path(__file__).resolve()
    found = _source_params_dir(here) or _installed_params_dir()
    if found is None:
        raise ParameterError(
            f"cannot find the params/ directory: none above {here}, and no share/{PACKAGE}/params/bev.yaml "
            f"in the ament index (AMENT_PREFIX_PATH={os.environ.get('AMENT_PREFIX_PATH', '')!r}); "
            "set RAD2_PARAMS_DIR or source the colcon install"
        )
    return found


class ResourceNotFoundError(ParameterError):
    """A repository-relative resource (checkpoint, dataset) is neither in the checkout nor installed."""


def resource_path(path: str | os.PathLike, required: bool = True) -> Path:
    """A repository-relative path (what params/*.yaml and the tools' defaults name: ``checkpoints/rad2_il``,
    ``data/eval_safety``) on disk; an absolute path is returned as it is.

    Looked up in the source checkout this module lies in (a checkout, a ``--symlink-install`` build or
    a build inside the checkout: edits apply without a rebuild), then in ``share/rad2_bringup`` of the
    installed package found through the ament index (``setup.py`` installs the shipped checkpoints and
    the bundled evaluation data there, so an install copied away from the checkout runs the demo).
    ``ResourceNotFoundError`` names the path and both places when neither has it; with ``required``
    False the path is returned where it would be (the checkout's first): for outputs and caches.
    ``$RAD2_PARAMS_DIR`` moves the parameter files only, not these.
    """
    p = Path(path)
    if p.is_absolute():
        return p
    here = Path(__file__).resolve()
    source = _source_params_dir(here)
    if source is not None and (source.parent / p).exists():
        return source.parent / p
    share = _installed_share()
    if share is not None and (share / p).exists():
        return share / p
    roots = [r for r in (source.parent if source is not None else None, share) if r is not None]
    if not required and roots:
        return roots[0] / p
    in_source = f"{source.parent / p}" if source is not None else f"none: no params/ above {here}"
    in_share = (f"{share / p}" if share is not None else "none: rad2_bringup is not in the ament index "
                f"(AMENT_PREFIX_PATH={os.environ.get('AMENT_PREFIX_PATH', '')!r})")
    raise ResourceNotFoundError(
        f"{p} not found: looked in the source checkout ({in_source}) and in the installed package "
        f"share ({in_share}); run from the rad2 checkout or source a colcon install of it")


def writable_dir(directory: str | os.PathLike, kind: str = "onnx") -> Path:
    """``directory`` when this process may write into it (or create it), else a per-user cache directory
    standing for it: ``$XDG_CACHE_HOME/rad2/<kind>/<16 hex digits of the SHA-256 of its absolute path>``
    (``~/.cache`` without XDG_CACHE_HOME), created here.

    Export caches are written beside the checkpoint they come from (``<checkpoint>/onnx``), and
    TensorRT engines into ``runtime.tensorrt.engine_cache_dir``. A checkpoint installed into the
    package share (a build without ``--symlink-install``, a system-wide install) may be read-only: its
    exports then go to the user's cache. Writability is judged with ``os.access`` on the directory or
    the nearest existing parent it would be created under (a read-only mount counts for root too).
    """
    d = Path(directory).absolute()
    probe = d
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if probe.is_dir() and os.access(probe, os.W_OK | os.X_OK):
        return Path(directory)
    base = os.environ.get("XDG_CACHE_HOME") or ""
    root = Path(base) if Path(base).is_absolute() else Path.home() / ".cache"
    cache = root / "rad2" / kind / hashlib.sha256(str(d).encode()).hexdigest()[:16]
    try:
        cache.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise PermissionError(f"{d} is not writable, nor is the cache directory {cache} ({exc})") from exc
    return cache


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
    """Load the ``ros__parameters`` block of ``params/<name>.yaml`` (or a path) as a nested dict,
    validated against its schema (see ``load_schema``).

    ``node`` picks a node-specific block; by default the wildcard ``/**`` block, or the only block.
    The wildcard (or only) block must hold every parameter of the schema; a block named for one node
    in a file with several blocks overrides a subset, so only its own values are checked.
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
    params = _nest_dotted(block["ros__parameters"] or {})
    complete = key == "/**" or len(doc) == 1
    # A file of params/ without its schema is an error (load_schema says so); another file (a test's
    # or a user's copy) is held to the schema beside it or to the shipped file's of the same name.
    if _in_params_dir(path) or schema_path(path).is_file():
        validate_params(params, load_schema(path), _display(path), complete=complete)
    return params


def _in_params_dir(path: Path) -> bool:
    try:
        return path.resolve().parent == params_dir().resolve()
    except ParameterError:
        return False


def require(params: dict[str, Any], dotted: str, source: str | None = None, block: str = "") -> Any:
    """Fetch ``a.b.c`` from a nested params dict, with an error naming the missing key; ``source`` (the
    file the dict came from, e.g. ``planner.yaml``) words it for a file written before the key existed:
    ``planner.yaml: missing key planner.initial_noise (older file?)``. ``block``: the dotted path of
    ``params`` in its file when it is a block of it (``runtime`` for planner.yaml's runtime block), for
    the message."""
    node: Any = params
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            full = f"{block}.{dotted}" if block else dotted
            raise ParameterError(f"{source}: missing key {full} (older file?)" if source
                                 else f"missing parameter {full!r}")
        node = node[part]
    return node


def param_names() -> tuple[str, ...]:
    """The names of the parameter files of params/ (``bev``, ``planner``, ...), sorted."""
    return tuple(sorted(p.stem for p in params_dir().glob("*.yaml") if not p.stem.endswith(".schema")))


def load_all(names: tuple[str, ...] | list[str] | None = None) -> dict[str, dict[str, Any]]:
    """``{name: load_params(name)}`` for ``names`` (None: every file of params/), each validated against
    its schema: what an entry point loads once and passes down."""
    return {name: load_params(name) for name in (param_names() if names is None else names)}


def merged(params_by_name: dict[str, dict[str, Any]], *names: str) -> dict[str, Any]:
    """The top-level blocks of several files (``load_all()`` by name) in one dict, for a library that
    reads blocks of several files (a log reader: ``adapters`` of bev.yaml, ``sim`` and ``metrics`` of
    sim.yaml, ``validators``); no two files of params/ share a block name, a clash is an error."""
    out: dict[str, Any] = {}
    for name in names:
        for block, value in params_by_name[name].items():
            if block in out:
                raise ParameterError(f"params/{name}.yaml: block {block!r} is also in another of {names}")
            out[block] = value
    return out


def load_merged(*names: str) -> dict[str, Any]:
    """``merged(load_all(names), *names)``: the files ``names`` (none: every file of params/) loaded and
    validated, their blocks in one dict (an entry point's call for a library that reads several
    files: the simulator, the policies, the training and evaluation runs)."""
    names = names or param_names()
    return merged(load_all(names), *names)


def cached_by_block(cache: dict[str, Any], params: dict[str, Any], block: str, build) -> Any:
    """``build(params)`` cached in ``cache`` by the content of the ``block`` block of ``params``; the
    cache is emptied past 16 entries. Reads no file: ``params`` is what the caller loaded."""
    if not isinstance(params, dict):
        raise ParameterError(f"expected a params dict with a {block!r} block, got {type(params).__name__} "
                             "(load the file at the entry point and pass it down)")
    key = repr(params.get(block))
    cfg = cache.get(key)
    if cfg is None:
        cfg = build(params)
        if len(cache) > 16:
            cache.clear()
        cache[key] = cfg
    return cfg


def parse_node_overrides(items: list[str]) -> dict[str, dict[str, Any]]:
    """``--set NODE.PARAM=VALUE`` items (rad2 graph up, demo, eval replay) -> {node: {param: value}}.

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


def budget_seconds(minutes: float | None, name: str) -> float | None:
    """A ``--time-budget-min``-style value in seconds (None stays None); a ParameterError naming ``name``
    and the value unless it is a finite number of minutes > 0."""
    if minutes is None:
        return None
    if not (math.isfinite(minutes) and minutes > 0):
        raise ParameterError(f"{name}: must be a finite number of minutes > 0, got {minutes!r}")
    return float(minutes) * 60.0


def parse_block_overrides(name: str, block: str, items: list[str]) -> dict[str, Any]:
    """``--set KEY=VALUE`` items of one block of ``params/<name>.yaml`` (e.g. the ``self_correction``
    block of training.yaml for rad2 train self-correction) -> ``{KEY: value}``. VALUE is parsed as
    YAML (an empty VALUE stays ""); the items are checked against the schema as ``block.KEY``, so a bad
    one raises a ParameterError naming it."""
    out = key_values(items, "--set", f"a setting of {block}")
    validate_overrides(name, {f"{block}.{k}": v for k, v in out.items()})
    return out


def key_values(items: list[str], option: str, what: str) -> dict[str, Any]:
    """``KEY=VALUE`` command-line items -> ``{KEY: value}``, VALUE parsed as YAML (an empty VALUE stays
    ""); a ParameterError names ``option`` and the item when one has no ``=`` or no KEY (``what``: what a
    KEY must be, for the message)."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ParameterError(f"{option} {item!r}: expected KEY=VALUE with KEY {what}")
        out[key.strip()] = yaml.safe_load(value) if value != "" else ""
    return out


def apply_overrides(params: dict[str, Any], flat: dict[str, Any]) -> None:
    """Set the dotted keys of ``flat`` in the nested dict ``params`` (in place)."""
    for key, value in flat.items():
        node = params
        *path, last = key.split(".")
        for p in path:
            node = node[p]
        node[last] = value


def params_with_overrides(name: str, items: list[str], option: str = "--set") -> tuple[dict[str, Any], dict]:
    """(``params/<name>.yaml`` with ``KEY=VALUE`` items applied, the applied ``{KEY: value}``).

    KEY is a dotted name of the file (``sim.reactive_agents=true`` or ``reactive.time_headway=1.0`` of
    sim.yaml); VALUE is parsed as YAML. Each item is checked against the schema, so a bad one raises a
    ParameterError naming ``option``, the key and the value."""
    flat = key_values(items, option, f"a setting of params/{name}.yaml (e.g. sim.reactive_agents=true)")
    try:
        validate_overrides(name, flat)
    except ParameterError as exc:
        raise ParameterError(f"{option}: {exc}") from None
    params = load_params(name)
    apply_overrides(params, flat)
    return params, flat


# --------------------------------------------------------------------------------------------------
# Schema: params/<name>.schema.yaml beside each parameter file
# --------------------------------------------------------------------------------------------------

SCHEMA_TYPES = ("bool", "int", "float", "string", "list")
_SCHEMA_FIELDS = {"type", "unit", "description", "min", "max", "choices", "items", "length", "read_only"}
_PY_TYPES = {"bool": "a bool", "int": "an int", "float": "a number", "string": "a string", "list": "a list"}


@dataclass(frozen=True)
class ParamSchema:
    """One entry of a schema file: what a parameter is and which values it may take.

    ``min``/``max`` are inclusive (None: unbounded on that side) and apply to each element of a list
    whose ``items`` are numeric; ``choices`` likewise to a string or to each string element.
    """

    name: str
    type: str
    unit: str
    description: str
    min: float | None = None
    max: float | None = None
    choices: tuple[Any, ...] | None = None
    items: str | None = None
    length: int | None = None
    read_only: bool = False

    @property
    def numeric(self) -> bool:
        """Int or float, or a list of them: the kinds that need a range."""
        return self.type in ("int", "float") or (self.type == "list" and self.items in ("int", "float"))

    def range_text(self) -> str:
        lo = "-inf" if self.min is None else self.min
        hi = "inf" if self.max is None else self.max
        return f"[{lo}, {hi}]"


def _display(path: Path) -> str:
    """``params/planner.yaml`` for files of the repository (what error messages name), else the path."""
    try:
        return str(Path(path).resolve().relative_to(params_dir().resolve().parent))
    except (ValueError, ParameterError):
        return str(path)


def schema_path(name: str | os.PathLike) -> Path:
    """The schema of a parameter file: ``<stem>.schema.yaml`` beside it, else the one of the same
    name in params/ (a copy of a shipped file elsewhere is held to the shipped file's schema)."""
    path = Path(name)
    if path.suffix not in (".yaml", ".yml"):
        return params_dir() / f"{name}.schema.yaml"
    beside = path.with_name(f"{path.stem}.schema.yaml")
    return beside if beside.is_file() else params_dir() / f"{path.stem}.schema.yaml"


_SCHEMAS: dict[tuple[str, float], dict[str, ParamSchema]] = {}


def load_schema(name: str | os.PathLike) -> dict[str, ParamSchema]:
    """Dotted parameter name -> ``ParamSchema`` for ``params/<name>.yaml`` (a name or the file's path).

    The schema file itself is checked: known fields only, a type of ``SCHEMA_TYPES``, a description
    and a unit for every entry, and both range sides stated (null = unbounded) for every numeric.
    """
    path = schema_path(name)
    if not path.is_file():
        raise ParameterError(f"{_display(path)} does not exist: every parameter file needs a schema")
    key = (str(path.resolve()), path.stat().st_mtime)
    if key in _SCHEMAS:
        return _SCHEMAS[key]
    with path.open() as f:
        doc = yaml.safe_load(f)
    where = _display(path)
    if not isinstance(doc, dict) or not doc:
        raise ParameterError(f"{where}: expected a mapping of dotted parameter names to entries")
    out: dict[str, ParamSchema] = {}
    for dotted, entry in doc.items():
        if not isinstance(entry, dict):
            raise ParameterError(f"{where}: {dotted}: expected a mapping (type, unit, description, ...)")
        unknown = set(entry) - _SCHEMA_FIELDS
        missing = {"type", "unit", "description"} - set(entry)
        if unknown or missing:
            raise ParameterError(
                f"{where}: {dotted}: unknown fields {sorted(unknown)}, missing {sorted(missing)}")
        if entry["type"] not in SCHEMA_TYPES or entry.get("items") not in (None, *SCHEMA_TYPES):
            raise ParameterError(f"{where}: {dotted}: type/items must be one of {SCHEMA_TYPES}")
        if not str(entry["description"] or "").strip():
            raise ParameterError(f"{where}: {dotted}: empty description")
        choices = entry.get("choices")
        spec = ParamSchema(
            name=str(dotted), type=entry["type"], unit=str(entry["unit"]),
            description=str(entry["description"]).strip(), min=entry.get("min"), max=entry.get("max"),
            choices=tuple(choices) if choices is not None else None, items=entry.get("items"),
            length=entry.get("length"), read_only=bool(entry.get("read_only", False)),
        )
        if spec.numeric and ("min" not in entry or "max" not in entry):
            raise ParameterError(
                f"{where}: {dotted}: a numeric parameter states min and max (null: unbounded)")
        if spec.min is not None and spec.max is not None and spec.min > spec.max:
            raise ParameterError(f"{where}: {dotted}: min {spec.min} > max {spec.max}")
        out[str(dotted)] = spec
    _SCHEMAS[key] = out
    return out


def _scalar_problem(spec: ParamSchema, kind: str, value: Any, what: str) -> str | None:
    """Why ``value`` is not a valid ``kind`` scalar of ``spec`` (None when it is). ``what`` prefixes the
    reason for list elements ("has an element 3 that ...")."""
    if kind == "bool":
        ok = isinstance(value, bool)
    elif kind == "int":
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif kind == "float":
        # An int is a valid float (YAML and ROS overrides write 100 for 100.0).
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    elif kind == "string":
        ok = isinstance(value, str)
    else:
        ok = isinstance(value, (list, tuple))
    if not ok:
        of = "" if spec.items is None else " of " + spec.items
        return f"{what}is not {_PY_TYPES[kind]} ({spec.type}{of})"
    if kind in ("int", "float"):
        if not math.isfinite(value):
            return f"{what}is not finite"
        if spec.min is not None and value < spec.min:
            return f"{what}is below its minimum {spec.min}"
        if spec.max is not None and value > spec.max:
            return f"{what}is above its maximum {spec.max}"
    if spec.choices is not None and kind in ("string", "int") and value not in spec.choices:
        return f"{what}is not one of {list(spec.choices)}"
    return None


def value_problem(spec: ParamSchema, value: Any) -> str | None:
    """Why ``value`` is not valid for ``spec`` ("is below its minimum 1", ...), or None."""
    problem = _scalar_problem(spec, spec.type, value, "")
    if problem or spec.type != "list":
        return problem
    if spec.length is not None and len(value) != spec.length:
        return f"has {len(value)} elements, not {spec.length}"
    if spec.items is not None:
        for item in value:
            problem = _scalar_problem(spec, spec.items, item, f"has an element {item!r} that ")
            if problem:
                return problem
    return None


def _flatten_dotted(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(_flatten_dotted(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def validate_value(schema: dict[str, ParamSchema], dotted: str, value: Any, source: str) -> None:
    """Raise ``ParameterError`` ("<source>: <dotted> = <value> <why>") unless ``value`` is valid."""
    spec = schema.get(dotted)
    if spec is None:
        raise ParameterError(f"{source}: {dotted} = {value!r} is not a parameter of its schema")
    problem = value_problem(spec, value)
    if problem:
        raise ParameterError(f"{source}: {dotted} = {value!r} {problem}")


def validate_params(
    params: dict[str, Any], schema: dict[str, ParamSchema], source: str, complete: bool = True
) -> None:
    """Check a nested params dict: every key known and valid; with ``complete`` also none missing."""
    flat = _flatten_dotted(params)
    for dotted, value in flat.items():
        validate_value(schema, dotted, value, source)
    if complete:
        missing = sorted(set(schema) - set(flat))
        if missing:
            raise ParameterError(f"{source}: {', '.join(missing)} missing (the schema lists them)")


def validate_overrides(name: str | os.PathLike, overrides: dict[str, Any]) -> None:
    """Check overrides of ``params/<name>.yaml`` (``--set`` items, ROS ``-p`` values) against its
    schema: ``overrides`` maps dotted names (or nested dicts, as ``load_params`` returns) to values."""
    path = Path(name)
    source = _display(path) if path.suffix in (".yaml", ".yml") else f"params/{name}.yaml"
    validate_params(overrides, load_schema(name), f"{source} (override)", complete=False)


def merge_runtime_overrides(runtime: dict[str, Any], overrides: dict[str, Any]) -> None:
    """``runtime`` (params/planner.yaml's block) updated in place with ``overrides`` (``runtime.*``
    keys), checked against the schema first; a dict value updates the keys of that sub-block only
    (``{"openvino": {"precision": "bf16"}}`` keeps ``runtime.openvino.threads``)."""
    validate_overrides("planner", {"runtime": overrides})
    for key, value in overrides.items():
        runtime[key] = {**runtime[key], **value} if isinstance(value, dict) else value
