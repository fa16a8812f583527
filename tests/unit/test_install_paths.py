"""Where the rad2 command and the bring-up find their files: in the checkout, and in a colcon install
sourced away from it (rad2_ros.rosenv, rad2_bringup.graphs)."""

from __future__ import annotations

import sys
from pathlib import Path

from rad2_bringup import graphs
from rad2_ros.rosenv import REPO_ROOT, in_checkout, rad2_variables

ROOT = Path(__file__).resolve().parents[2]


def test_in_the_checkout_the_graphs_and_parameter_files_are_the_checkouts():
    assert in_checkout(ROOT) and REPO_ROOT == ROOT
    assert graphs.GRAPHS_FILE == ROOT / "launch" / "graphs.yaml"
    planner = next(n for n in graphs.load_graph("vehicle").nodes if n.name == "planner")
    assert planner.param_paths() == [ROOT / p for p in planner.param_files]
    assert planner.param_paths(Path("/elsewhere")) == [Path("/elsewhere") / p for p in planner.param_files]
    fixed = rad2_variables()
    assert fixed["RAD2_ROOT"] == str(ROOT) and fixed["FASTDDS_DEFAULT_PROFILES_FILE"].startswith(str(ROOT))


def test_away_from_a_checkout_the_installed_profile_and_this_virtualenv_are_used(tmp_path, monkeypatch):
    prefix = tmp_path / "install" / "rad2_bringup"
    profile = prefix / "share" / "rad2_bringup" / "tools" / "fastdds_localhost.xml"
    profile.parent.mkdir(parents=True)
    profile.write_text("<dds/>")
    monkeypatch.setenv("AMENT_PREFIX_PATH", f"{tmp_path / 'other'}:{prefix}")
    monkeypatch.delenv("RAD2_VENV", raising=False)
    away = tmp_path / "not_a_checkout"
    assert not in_checkout(away)
    found = rad2_variables(away)
    # nothing names a checkout that is not there; node logs go where ROS puts them by default
    assert "RAD2_ROOT" not in found and "RAD2_WS" not in found and "ROS_LOG_DIR" not in found
    assert found["FASTDDS_DEFAULT_PROFILES_FILE"] == str(profile)
    assert found["ROS_AUTOMATIC_DISCOVERY_RANGE"] == "LOCALHOST"
    assert found["RAD2_VENV"] == (sys.prefix if sys.prefix != sys.base_prefix else str(away / ".venv"))
    monkeypatch.setenv("AMENT_PREFIX_PATH", str(tmp_path / "other"))
    assert "FASTDDS_DEFAULT_PROFILES_FILE" not in rad2_variables(away)  # none installed: Fast DDS defaults
