"""One parameter schema beside each YAML: every key described, every numeric ranged, and every bad value
(out of range, wrong type, unknown or missing key) rejected at load naming file, key and value; the
ROS nodes declare their parameters with the descriptors of the same schemas; params/ is installed with
rad2_planner and found through the ament index away from the checkout."""

import copy
import importlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from rad2_core import config
from rad2_core.config import ParameterError, load_params, load_schema, params_dir, validate_overrides

ROOT = Path(__file__).resolve().parents[2]
NAMES = sorted(p.stem for p in params_dir().glob("*.yaml") if not p.stem.endswith(".schema"))
# module -> the node it defines; each module's PARAM_FILES / PREFIXES are what its node declares
NODE_MODULES = (
    "rad2_ros.nodes.perception_node",
    "rad2_ros.nodes.planner_node",
    "rad2_ros.nodes.controller_node",
    "rad2_ros.nodes.supervisor_node",
    "rad2_ros.nodes.sim_node",
)


def test_every_parameter_file_has_a_schema_that_describes_every_key():
    expected = {"bev", "controller", "nodes", "planner", "scenarios", "sim", "training", "vehicle",
                "validators"}
    assert expected <= set(NAMES)
    for name in NAMES:
        schema = load_schema(name)  # the schema file itself: fields, description, unit, both range sides
        flat = config._flatten_dotted(load_params(name))
        assert set(flat) == set(schema), name
        for key, spec in schema.items():
            assert spec.description and spec.unit, (name, key)
            if spec.numeric:
                assert spec.min is not None and spec.max is not None, (name, key)


def test_a_file_of_params_without_its_schema_is_refused(tmp_path, monkeypatch):
    # a copy of params/ with one schema missing stands for a new file added without one
    copied = tmp_path / "params"
    shutil.copytree(params_dir(), copied)
    (copied / "scenarios.schema.yaml").unlink()
    monkeypatch.setenv("RAD2_PARAMS_DIR", str(copied))
    with pytest.raises(ParameterError, match=r"scenarios\.schema\.yaml does not exist"):
        load_params("scenarios")


def _outside(spec, current):
    """A value just outside the range (below min, else above max), for a list in every element (so
    its length stays valid)."""
    integer = spec.type == "int" or spec.items == "int"
    if spec.min is not None:
        bad = int(spec.min) - 1 if integer else float(spec.min) - max(1.0, abs(float(spec.min)))
    else:
        bad = int(spec.max) + 1 if integer else float(spec.max) + max(1.0, abs(float(spec.max)))
    return [bad] * len(current) if spec.type == "list" else bad


@pytest.mark.parametrize("name", NAMES)
def test_every_numeric_parameter_out_of_range_is_rejected_naming_file_key_and_value(name, tmp_path):
    """Each numeric value of the file in turn set out of range in a copy of the file: load_params
    fails naming that file, the key and the value."""
    schema = load_schema(name)
    source = params_dir() / f"{name}.yaml"
    doc = yaml.safe_load(source.read_text())
    block_key = "/**" if "/**" in doc else next(iter(doc))
    flat = config._flatten_dotted(load_params(name))
    path = tmp_path / f"{name}.yaml"  # same name: held to params/<name>.schema.yaml
    checked = 0
    for key, spec in schema.items():
        if not spec.numeric:
            continue
        bad = _outside(spec, flat[key])
        bad_doc = copy.deepcopy(doc)
        bad_doc[block_key]["ros__parameters"] = config._nest_dotted({**flat, key: bad})
        path.write_text(yaml.safe_dump(bad_doc))
        limit = "minimum" if spec.min is not None else "maximum"
        with pytest.raises(ParameterError, match=re.escape(f"{path}: {key} = {bad!r}") + f".*{limit}"):
            load_params(path)
        checked += 1
    assert checked > 0


def test_wrong_type_unknown_and_missing_keys_and_ints_for_floats():
    schema = load_schema("planner")
    flat = config._flatten_dotted(load_params("planner"))
    src = "params/planner.yaml"
    with pytest.raises(ParameterError, match="planner.num_candidates"):
        config.validate_params(config._nest_dotted({**flat, "planner.num_candidates": "many"}), schema, src)
    with pytest.raises(ParameterError, match="planner.made_up"):
        config.validate_params(config._nest_dotted({**flat, "planner.made_up": 1}), schema, src)
    missing = {k: v for k, v in flat.items() if k != "planner.plan_dt"}
    with pytest.raises(ParameterError, match="planner.plan_dt"):
        config.validate_params(config._nest_dotted(missing), schema, src)
    # an int where a float is expected is fine (a YAML or command-line "80" for 80.0)
    config.validate_params(config._nest_dotted({**flat, "planner.deadline_ms": 80}), schema, src)


def test_overrides_are_checked_like_the_files():
    validate_overrides("planner", {"planner.deadline_ms": 80})
    with pytest.raises(ParameterError, match="planner.num_candidates"):
        validate_overrides("planner", {"planner.num_candidates": 0})
    with pytest.raises(ParameterError, match="planner.made_up"):
        validate_overrides("planner", {"planner.made_up": 1})


def test_key_value_overrides_change_only_their_keys_and_bad_ones_name_the_option():
    from rad2_core.config import load_params, params_with_overrides

    base = load_params("sim")
    params, applied = params_with_overrides("sim", ["sim.reactive_agents=true", "reactive.time_headway=1.0"],
                                            "--sim-set")
    assert applied == {"sim.reactive_agents": True, "reactive.time_headway": 1.0}
    assert params["sim"]["reactive_agents"] is True and params["reactive"]["time_headway"] == 1.0
    params["sim"]["reactive_agents"], params["reactive"]["time_headway"] = (
        base["sim"]["reactive_agents"], base["reactive"]["time_headway"])
    assert params == base
    for item, named in (("sim.reactive_agents=perhaps", "sim.reactive_agents"),
                        ("sim.made_up=1", "sim.made_up"), ("reactive.b_max=-3", "reactive.b_max"),
                        ("reactive_agents", "KEY=VALUE")):
        with pytest.raises(ParameterError, match=named) as err:
            params_with_overrides("sim", [item], "--sim-set")
        assert "--sim-set" in str(err.value)


def test_scenario_presets_and_kinds_are_checked():
    cfg = load_params("scenarios")["scenarios"]  # validated against params/scenarios.schema.yaml
    assert cfg["presets"]["eval_signals"]["network"] == "grid"
    with pytest.raises(ParameterError, match=r"eval_signals.network = 'motorway' is not one of"):
        validate_overrides("scenarios", {"scenarios.presets.eval_signals.network": "motorway"})
    with pytest.raises(ParameterError, match=r"scenarios.kinds.cut_in.networks = \['grid', 'tunnel'\]"):
        validate_overrides("scenarios", {"scenarios.kinds.cut_in.networks": ["grid", "tunnel"]})
    with pytest.raises(ParameterError, match=r"events.cut_in.gap_m = \[3.0\] has 1 elements, not 2"):
        validate_overrides("scenarios", {"scenarios.events.cut_in.gap_m": [3.0]})


# --------------------------------------------------------------------------------------------------
# The nodes' parameters: descriptors from the schemas
# --------------------------------------------------------------------------------------------------


def _ros():
    """Skip without the colcon build (the node modules import rad2_msgs), else make it importable."""
    from ros_process import import_ros_messages, require_ros_build

    require_ros_build()
    import_ros_messages()
    from rad2_ros.nodes import parameters

    return parameters


def test_every_node_parameter_has_a_description_and_a_range_where_numeric():
    node_params = _ros()
    for module_name in NODE_MODULES:
        module = importlib.import_module(module_name)
        prefixes = getattr(module, "PREFIXES", None)
        table = node_params.node_parameters(module.PARAM_FILES, prefixes=prefixes)
        if prefixes is not None:  # every prefix a node lists still names some parameter
            assert {name.split(".")[0] for name in table} == set(prefixes), module_name
        declared = [p for p in table.values() if p.declarable]
        assert declared, module_name
        for param in declared:
            where = (module_name, param.name)
            desc = node_params._descriptor(param)
            assert desc.description.strip() and desc.description.startswith(param.spec.description), where
            assert desc.read_only == param.spec.read_only, where
            if not param.spec.numeric:
                continue
            assert param.spec.min is not None and param.spec.max is not None, where
            assert desc.additional_constraints, where
            if isinstance(param.value, bool) or param.spec.type == "list":
                continue  # ROS has no ranges for arrays: the range is in additional_constraints
            ranges = desc.integer_range if isinstance(param.value, int) else desc.floating_point_range
            assert len(ranges) == 1, where
            assert ranges[0].from_value <= param.value <= ranges[0].to_value, where


def test_descriptors_keep_what_the_nodes_declared_before():
    """The ranges and read-only flags the nodes' own tables gave (now in the schemas)."""
    node_params = _ros()
    table = {**node_params.node_parameters(["controller", "vehicle"]),
             **node_params.node_parameters(["nodes"])}
    def described(name):
        d = node_params._descriptor(table[name])
        (r,) = d.floating_point_range or d.integer_range
        return d.read_only, (r.from_value, r.to_value)

    assert described("controller.dt") == (True, (0.01, 1.0))
    assert described("controller.ilqr.max_iterations") == (False, (1, 1000))
    assert described("planner_node.torch_threads") == (True, (1, 256))
    for name in ("perception.map_file", "perception.clip_id", "perception.route", "vehicle.length"):
        assert node_params._descriptor(table[name]).read_only, name
    assert not node_params._descriptor(table["planner_node.markers"]).read_only
    assert "Unit: s." in node_params._descriptor(table["supervisor.timeout_s"]).description


@pytest.fixture
def probe_node(monkeypatch):
    """A bare rclpy node on its own context and DDS domain, made with the given ``-p`` overrides."""
    _ros()
    import rclpy
    from rclpy.node import Node
    from ros_process import unique_domain_id

    monkeypatch.setenv("ROS_DOMAIN_ID", str(unique_domain_id()))
    made = []

    def make(*overrides: str):
        context = rclpy.Context()
        rclpy.init(context=context)
        args = ["--ros-args"] + [a for o in overrides for a in ("-p", o)]
        node = Node("param_schema_probe", context=context, cli_args=args, start_parameter_services=False,
                    enable_rosout=False)
        made.append((node, context))
        return node

    yield make
    for node, context in made:
        node.destroy_node()
        rclpy.shutdown(context=context)


def test_declared_parameters_carry_the_schema_and_bad_overrides_fail(probe_node):
    node_params = _ros()
    node = probe_node("supervisor.timeout_s:=0.5")
    values = node_params.declare_parameters(node, ["nodes"], prefixes=("supervisor",))
    assert values["supervisor"]["timeout_s"] == 0.5
    spec = load_schema("nodes")["supervisor.timeout_s"]
    desc = node.describe_parameter("supervisor.timeout_s")
    assert desc.description.startswith(spec.description)
    assert desc.floating_point_range[0].to_value == spec.max
    # out of the schema's range: refused at declaration, naming file, key, value and bound
    node = probe_node(f"supervisor.timeout_s:={spec.max * 2}")
    out_of_range = (rf"params/nodes.yaml \(override\): supervisor.timeout_s = {spec.max * 2} "
                    r"is above its maximum")
    with pytest.raises(ParameterError, match=out_of_range):
        node_params.declare_parameters(node, ["nodes"], prefixes=("supervisor",))
    # what ROS cannot check (choices): the schema check names file, key and value
    node = probe_node("planner.backend:=tensorflow")
    bad_choice = r"params/planner.yaml \(override\): planner.backend = 'tensorflow' is not one of"
    with pytest.raises(ParameterError, match=bad_choice):
        node_params.declare_parameters(node, ["planner"], prefixes=("planner",))


# --------------------------------------------------------------------------------------------------
# params/ installed with rad2_planner (share/rad2_bringup/params) and found through the ament index
# --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def prefix(tmp_path_factory) -> Path:
    """An install prefix with rad2_bringup's data files, as a build without --symlink-install makes
    them (colcon runs ``setup.py ... install_data`` from the package source)."""
    prefix = tmp_path_factory.mktemp("install")
    pkg = ROOT / "ros2_ws" / "src" / "rad2_bringup"
    subprocess.run([sys.executable, "setup.py", "-q", "install_data", "--install-dir", str(prefix)],
                   cwd=pkg, check=True, capture_output=True, timeout=120)
    return prefix


def test_setup_installs_every_params_file_into_the_package_share(prefix):
    installed = prefix / "share" / "rad2_bringup" / "params"
    shipped = sorted(p.name for p in params_dir().glob("*.yaml"))
    assert sorted(p.name for p in installed.glob("*.yaml")) == shipped
    for name in shipped:
        assert (installed / name).read_bytes() == (params_dir() / name).read_bytes(), name
    assert (prefix / "share" / "ament_index" / "resource_index" / "packages" / "rad2_bringup").is_file()


def _run_outside_checkout(tmp_path: Path, ament_prefix_path: str, code: str) -> subprocess.CompletedProcess:
    """``code`` run with rad2_core.config copied out of the checkout (as an install puts it), from
    another working directory, with only the given AMENT_PREFIX_PATH."""
    site = tmp_path / "site" / "rad2_core"
    site.mkdir(parents=True)
    src = ROOT / "ros2_ws" / "src" / "rad2_core" / "rad2_core"
    for name in ("__init__.py", "config.py"):
        shutil.copy(src / name, site / name)
    env = {k: v for k, v in os.environ.items() if k not in ("RAD2_PARAMS_DIR", "PYTHONPATH")}
    env.update(PYTHONPATH=str(site.parent), AMENT_PREFIX_PATH=ament_prefix_path)
    work = tmp_path / "elsewhere"
    work.mkdir()
    return subprocess.run([sys.executable, "-c", code], cwd=work, env=env, capture_output=True, text=True,
                          timeout=120)


def test_params_found_through_the_ament_index_away_from_the_checkout(prefix, tmp_path):
    code = ("from rad2_core import config\n"
            "print(config.params_dir())\n"
            f"for name in {NAMES!r}:\n"
            "    config.load_params(name)  # validated against the installed schema\n")
    res = _run_outside_checkout(tmp_path, str(prefix), code)
    assert res.returncode == 0, res.stderr
    assert Path(res.stdout.strip()) == prefix / "share" / "rad2_bringup" / "params"


def test_params_dir_without_source_tree_or_install_says_where_it_looked(tmp_path):
    res = _run_outside_checkout(tmp_path, str(tmp_path / "nothing"),
                                "from rad2_core import config\nconfig.params_dir()\n")
    assert res.returncode != 0
    assert "cannot find the params/ directory" in res.stderr and "RAD2_PARAMS_DIR" in res.stderr


def test_the_source_tree_wins_over_an_install(prefix, monkeypatch):
    """In a checkout (or a --symlink-install build) edits to params/ apply without a rebuild."""
    monkeypatch.delenv("RAD2_PARAMS_DIR", raising=False)
    monkeypatch.setenv("AMENT_PREFIX_PATH", str(prefix))
    assert params_dir() == ROOT / "params"
    assert config._installed_params_dir() == prefix / "share" / "rad2_bringup" / "params"
