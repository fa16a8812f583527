"""Parameters are read at the entry points only: the ROS nodes, the ``rad2`` verbs and the bring-up,
demo and harness mains load and validate params/*.yaml once and pass the dicts (or typed configs
built from them) down; a library never reads a parameter file itself, so the value a run uses is the
one its entry point loaded (and overrode), not a second read of the file deep inside a call.

The test walks the syntax tree of every module of ``ros2_ws/src/<pkg>/<pkg>/`` and fails on a module
outside the entry points that calls a loader of ``rad2_core.config`` or names a ``params/*.yaml`` file.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "ros2_ws" / "src"

# The calls of rad2_core.config that read parameter files: values (load_params, load_all, load_merged,
# params_with_overrides), or the schema for its choices and bounds (load_schema, schema_path), or the
# directory itself (params_dir, param_names).
LOADERS = {"load_params", "load_all", "load_merged", "params_with_overrides", "load_schema", "schema_path",
           "params_dir", "param_names"}

PARAMS_FILE = re.compile(r"(\S*/)?params/[\w.-]+\.ya?ml")

# Entry points by path under ros2_ws/src (a trailing "/" takes the whole folder).
ENTRY_POINTS = (
    "rad2_ros/rad2_ros/nodes/",  # the ROS nodes: declare their parameters from the files and schemas
    "rad2_bringup/rad2_bringup/",  # the rad2 verbs, bring-up, demo and harness mains
    "rad2_core/rad2_core/config.py",  # the loader itself
)

# (module, loader) pairs outside the entry points, each with the reason; the schema is read for its
# bounds and choices only, never for a value.
ALLOWED = {
    ("rad2_core/rad2_core/cli_args.py", "load_schema"):
        "argparse types and choices of the rad2 verbs: an option is parsed against its parameter's schema "
        "entry while the verb parses its command line, i.e. at the entry point",
    ("rad2_planner/rad2_planner/policy.py", "load_schema"):
        "M and K may change with every planning call (RL, benchmarks, experiments): each call's counts are "
        "checked against the bounds of planner.num_candidates / num_denoise_steps; the settings a policy is "
        "built with (a dict built in code, an argument overriding the file) against their choices and bounds",
}


def _modules() -> list[Path]:
    return sorted(p for p in SRC.glob("*/*/**/*.py")
                  if p.relative_to(SRC).parts[0] == p.relative_to(SRC).parts[1])


def _is_entry_point(rel: str) -> bool:
    return any(rel.startswith(e) if e.endswith("/") else rel == e for e in ENTRY_POINTS)


def _violations(path: Path) -> list[str]:
    """``line: what`` for each loader call and each params/*.yaml literal of one module."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
            if name in LOADERS:
                out.append(f"{node.lineno}: calls {name}()")
        elif isinstance(node, (ast.ImportFrom,)) and node.module == "rad2_core.config":
            for alias in node.names:
                if alias.name in LOADERS:
                    out.append(f"{node.lineno}: imports {alias.name}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            # a path to open (messages and docstrings that mention a file have words around it)
            if PARAMS_FILE.fullmatch(node.value):
                out.append(f"{node.lineno}: names the file {node.value!r}")
    return out


def test_the_allow_list_names_existing_modules_that_are_no_entry_points():
    for rel, loader in ALLOWED:
        assert (SRC / rel).is_file(), rel
        assert not _is_entry_point(rel), rel
        assert loader in LOADERS, loader
        assert any(loader in v for v in _violations(SRC / rel)), f"{rel} no longer calls {loader}"


def test_only_entry_points_read_parameter_files():
    found = {}
    for path in _modules():
        rel = str(path.relative_to(SRC))
        if _is_entry_point(rel):
            continue
        allowed = {loader for module, loader in ALLOWED if module == rel}
        bad = [v for v in _violations(path) if not any(f"{loader}" in v for loader in allowed)]
        if bad:
            found[rel] = bad
    assert not found, (
        "libraries take their parameters from the caller (a params dict or a config built from it); "
        "load them at the entry point instead:\n"
        + "\n".join(f"  {rel}:{line}" for rel, lines in sorted(found.items()) for line in lines))


def test_the_walk_sees_the_loader_calls_it_is_meant_to_catch(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text(
        "from rad2_core.config import load_params\n"
        "import rad2_core.config as c\n"
        "def f(p=None):\n"
        "    return p if p is not None else load_params('bev')\n"
        "def g():\n"
        "    return c.load_merged('sim'), open('params/sim.yaml')\n"
        "def h(p):\n"
        "    raise ValueError('missing key x of params/sim.yaml')\n")
    lines = sorted(int(v.split(":")[0]) for v in _violations(sample))
    assert lines == [1, 4, 6, 6]  # the import, the two calls and the path; not the message


# What the code implements of a parameter with choices, by the tuple that names it: the schema is the one
# list of allowed values (files and overrides are checked against it), these say which branches exist;
# both must agree so that a value the schema allows always has its implementation.
REGISTRIES = {
    ("bev_warp_sim.warp", "BACKENDS"): ("sim", "sim.warp_backend"),
    ("rad2_planner.diffusion", "SAMPLERS"): ("planner", "planner.sampler"),
    ("rad2_planner.selection", "DISTRIBUTIONS"): ("planner", "planner.selection_distribution"),
    ("rad2_planner.selection", "TOP_K_MODES"): ("planner", "planner.selection_top_k"),
    ("rad2_planner.policy", "FALLBACK_RULES"): ("planner", "planner.fallback_selection"),
    ("rad2_planner.policy", "DISCRIMINATOR_CANDIDATES"): ("planner", "planner.discriminator_candidates"),
    ("rad2_planner.policy", "SELECTION_MODES"): ("planner", "planner.selection_mode"),
    ("rad2_planner.policy", "INITIAL_NOISE_MODES"): ("planner", "planner.initial_noise"),
    ("rad2_planner.safety_layer", "SAFETY_MODES"): ("planner", "safety_layer.mode"),
    ("rad2_training.train", "DISCRIMINATOR_INITS"): ("training", "rl.discriminator_init"),
    ("rad2_training.tc_grpo", "ADVANTAGES"): ("training", "rl.tc_grpo.advantage"),
    ("rad2_training.ogo", "SEGMENTS"): ("training", "rl.ogo.segment"),
    ("rad2_training.ogo", "TARGET_KINDS"): ("training", "rl.ogo.kinds"),
    ("rad2_datasets.scenarios.networks", "NETWORK_KINDS"):
        ("scenarios", "scenarios.presets.eval_signals.network"),
}


def test_code_registries_implement_exactly_the_schema_choices():
    import importlib

    from rad2_core.config import load_schema

    for (module, name), (params, dotted) in REGISTRIES.items():
        implemented = set(getattr(importlib.import_module(module), name))
        allowed = set(load_schema(params)[dotted].choices)
        assert implemented == allowed, f"{module}.{name} {sorted(implemented)} != {dotted} {sorted(allowed)}"
