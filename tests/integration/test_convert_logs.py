"""Real logs of any supported format -> one clip dataset (rad2_datasets/adapters/logs.py,
rad2 data convert): formats recognised from what is on disk, several promoted egos per NGSIM scene,
bad logs named and skipped on request, and the dataset evaluable like the bundled ones."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from rad2_core.config import load_merged
from rad2_core.storage import iter_dataset, read_index
from rad2_datasets.adapters.logs import LogFormatError, convert_logs, find_logs, load_log, log_format

LOG_PARAMS = load_merged("bev", "sim", "validators")

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
AV2_DIR = FIXTURES / "av2" / "0a1e6f0a-1817-4a98-b02e-db8c9327d151"
CR_FILE = FIXTURES / "commonroad" / "USA_US101-5_1_T-1.xml"


def _broken_sensor_log(root: Path) -> Path:
    """An AV2 sensor-log directory by its file names, with files that are no feather tables."""
    log = root / "sensor" / "log-broken"
    (log / "map").mkdir(parents=True)
    (log / "annotations.feather").write_bytes(b"not a feather file")
    (log / "city_SE3_egovehicle.feather").write_bytes(b"not a feather file")
    shutil.copy(next(AV2_DIR.glob("log_map_archive_*.json")), log / "map")
    return log


def test_formats_are_recognised_from_what_is_on_disk(tmp_path):
    assert log_format(AV2_DIR) == "av2"
    assert log_format(next(AV2_DIR.glob("scenario_*.parquet"))) == "av2"
    assert log_format(CR_FILE) == "commonroad"
    assert log_format(_broken_sensor_log(tmp_path)) == "av2_sensor"
    assert log_format(ROOT / "data" / "eval_signals") == "dataset"
    assert log_format(FIXTURES) is None  # a folder that holds logs is searched, not a log itself
    found = find_logs([FIXTURES, tmp_path])
    assert [(s.format, s.path) for s in found] == [
        ("av2", AV2_DIR), ("commonroad", CR_FILE), ("av2_sensor", tmp_path / "sensor" / "log-broken")]
    # the Lanelet2 maps under tests/fixtures are no logs and are passed over; a filter keeps one format
    assert [s.format for s in find_logs(FIXTURES, formats=["commonroad"])] == ["commonroad"]
    with pytest.raises(LogFormatError, match="no such file"):
        find_logs(tmp_path / "missing")
    stray = tmp_path / "notes.txt"
    stray.write_text("hello")
    with pytest.raises(LogFormatError, match=r"notes\.txt: not a log of a known format"):
        find_logs(stray)
    with pytest.raises(LogFormatError, match="unknown"):
        find_logs(FIXTURES, formats=["rosbag"])
    assert load_log(CR_FILE, LOG_PARAMS).metadata["source"] == "commonroad"


def test_conversion_writes_one_dataset_and_names_a_bad_log(tmp_path):
    logs = tmp_path / "logs"
    shutil.copytree(AV2_DIR, logs / "av2" / AV2_DIR.name)
    shutil.copy(CR_FILE, logs / CR_FILE.name)
    bad = _broken_sensor_log(logs)
    truncated = logs / "truncated.xml"  # a download cut short
    truncated.write_text(CR_FILE.read_text()[:3000])
    # without skip_bad the first broken log stops the conversion, named
    with pytest.raises(LogFormatError, match=r"truncated\.xml \(commonroad\)"):
        convert_logs(logs, tmp_path / "strict", LOG_PARAMS, egos_per_scenario=2, progress=False)
    written, index, errors = convert_logs(logs, tmp_path / "out", LOG_PARAMS, egos_per_scenario=3,
                                          skip_bad=True, progress=False)
    assert written == 4 and index["num_clips"] == 4  # 1 AV2 scenario + 3 promoted NGSIM egos
    assert len(errors) == 2 and any(str(bad) in e for e in errors)
    assert any("truncated.xml: not a readable CommonRoad" in e for e in errors)
    clips = list(iter_dataset(tmp_path / "out"))
    assert sorted(c.metadata["source"] for c in clips) == ["av2", "commonroad", "commonroad", "commonroad"]
    egos = [c.metadata["ego_obstacle_id"] for c in clips if c.metadata["source"] == "commonroad"]
    assert len(set(egos)) == 3
    # --limit and --append
    written, index, _ = convert_logs(CR_FILE, tmp_path / "out", LOG_PARAMS, egos_per_scenario=5, limit=2,
                                     append=True, progress=False)
    assert written == 2 and index["num_clips"] == 4 + 2 - 2  # two of the five egos were already there
    assert read_index(tmp_path / "out")["num_clips"] == 4


def test_cli_converts_prints_the_composition_and_refuses_bad_input(tmp_path):
    tool = ["-m", "rad2_bringup.cli", "data", "convert"]
    out = tmp_path / "real"
    run = subprocess.run([sys.executable, *tool, str(FIXTURES), "--out", str(out),
                          "--egos-per-scenario", "2", "--no-progress"],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert "3 clips written" in run.stdout and "commonroad" in run.stdout and "av2" in run.stdout
    assert read_index(out)["num_clips"] == 3
    bad = subprocess.run([sys.executable, *tool, str(tmp_path / "nothing"), "--out", str(tmp_path / "x")],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1 and "nothing: no such file or directory" in bad.stderr
    zero = subprocess.run([sys.executable, *tool, str(FIXTURES), "--out", str(tmp_path / "y"),
                           "--egos-per-scenario", "0"], capture_output=True, text=True, timeout=120)
    assert zero.returncode == 2 and "--egos-per-scenario" in zero.stderr
    broken = tmp_path / "broken.xml"
    broken.write_text('<?xml version="1.0"?><commonRoad><broken')
    nothing = subprocess.run([sys.executable, *tool, str(broken), "--out", str(tmp_path / "z"),
                              "--skip-bad", "--no-progress"], capture_output=True, text=True, timeout=120)
    assert nothing.returncode == 1 and "no clip converted" in nothing.stderr
    assert "broken.xml: not a readable CommonRoad" in nothing.stderr
    helped = subprocess.run([sys.executable, *tool, "--help"], capture_output=True, text=True,
                            timeout=120)
    assert helped.returncode == 0 and "--egos-per-scenario" in helped.stdout
