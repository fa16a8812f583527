"""One parameter schema beside each YAML: every key described, every numeric ranged, and every bad value
(out of range, wrong type, unknown or missing key) rejected at load naming file, key and value."""

import copy
import re

import pytest
from rad2_planner import config
from rad2_planner.config import ParameterError, load_params, load_schema, params_dir, validate_overrides

# the offline SUMO generator's file has no schema yet (docs/conventions.md, "Parameters")
WITHOUT_SCHEMA = {"scenarios"}
NAMES = sorted(p.stem for p in params_dir().glob("*.yaml") if not p.stem.endswith(".schema"))
SCHEMED = [n for n in NAMES if n not in WITHOUT_SCHEMA]


def test_every_parameter_file_has_a_schema_that_describes_every_key():
    expected = {"bev", "controller", "nodes", "planner", "sim", "training", "vehicle", "validators"}
    assert expected <= set(SCHEMED)
    for name in SCHEMED:
        schema = load_schema(name)  # the schema file itself: fields, description, unit, both range sides
        flat = config._flatten_dotted(load_params(name))
        assert set(flat) == set(schema), name
        for key, spec in schema.items():
            assert spec.description and spec.unit, (name, key)
            if spec.numeric:
                assert spec.min is not None and spec.max is not None, (name, key)


def _outside(spec):
    """A value just outside the range (below min, or above max)."""
    if spec.type == "int" or spec.items == "int":
        bad = int(spec.min) - 1
    else:
        bad = float(spec.min) - max(1.0, abs(float(spec.min)))
    return [bad] if spec.type == "list" else bad


@pytest.mark.parametrize("name", SCHEMED)
def test_every_numeric_parameter_out_of_range_is_rejected_naming_it(name):
    schema = load_schema(name)
    params = load_params(name)
    flat = config._flatten_dotted(params)
    checked = 0
    for key, spec in schema.items():
        if not spec.numeric:
            continue
        bad = copy.deepcopy(flat)
        bad[key] = _outside(spec)
        with pytest.raises(ParameterError, match=re.escape(f"params/{name}.yaml: {key}")):
            config.validate_params(config._nest_dotted(bad), schema, f"params/{name}.yaml")
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
