"""INTERACTION dataset track files (rad2_datasets.adapters.interaction) through rad2 data convert.

Every file is written here, from the format's definition: a Lanelet2 OSM map of a straight two-lane road
whose node lat/lon are the metric points projected back with UTM at origin (0, 0) (as the dataset's maps
are), a vehicle track file and a pedestrian track file, in the dataset's layout
``<root>/maps/<location>.osm`` + ``<root>/recorded_trackfiles/<location>/vehicle_tracks_000.csv``.

The road, in the map frame (metres; the dataset's maps sit about 1 km from the origin too): x 1000..1300
heading east, right lane y 996.5..1000 (lanelets 101 -> 102 -> 103, 100 m each), left lane y
1000..1003.5 (111 -> 112 -> 113), a dashed marking between them. The tracks (10 Hz, frames 1..200):

- 1: car 4.6 x 1.9 m in the right lane (y 998.25) from x 1010 at 10 m/s;
- 2: car 4.4 x 1.8 m in the left lane (y 1001.75) from x 1000 at 12 m/s (travels farthest: ranked first);
- 3: truck 12 x 2.5 m in the right lane from x 1080 at 8 m/s (too long to be promoted);
- 4: car parked beside the road (y 1006) for all 200 frames (does not move: never the ego);
- 5: car in the right lane for 3 s only (frames 120..150), far behind 1 (too short for a clip);
- pedestrian file: P1 walking on the verge (y 994.5) at 1.2 m/s, P2 riding a bicycle at 5 m/s (both of
  the dataset's combined type ``pedestrian/bicycle``).
"""

from __future__ import annotations

import math
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

lanelet2 = pytest.importorskip(
    "lanelet2", reason="the lanelet2 package is not installed (tools/requirements.txt pins lanelet2==1.2.3)")

from rad2_core.clip import AGENT_CYCLIST, AGENT_PEDESTRIAN, AGENT_VEHICLE  # noqa: E402
from rad2_core.config import load_merged  # noqa: E402
from rad2_core.storage import load_dataset  # noqa: E402
from rad2_datasets.adapters.interaction import (  # noqa: E402
    PEDESTRIAN_COLUMNS,
    PEDESTRIAN_ID_OFFSET,
    VEHICLE_COLUMNS,
    InteractionFormatError,
    find_map,
    iter_interaction_clips,
    load_interaction_clip,
    load_location_map,
    track_file_kind,
)
from rad2_datasets.adapters.logs import (  # noqa: E402
    FORMATS,
    LogFormatError,
    convert_logs,
    find_logs,
    log_format,
)

PARAMS = load_merged("bev", "sim", "validators")
SIM_DT = float(PARAMS["sim"]["dt"])
LOCATION = "TEST_Straight_Road"
X0, Y0 = 1000.0, 1000.0
LANE_W = 3.5
FRAMES = np.arange(1, 201)  # frame_id, timestamp_ms = 100 x frame_id
REAL = Path("/work/shared/data/interaction")


# ------------------------------------------------------------------------------------------------------
# the files
# ------------------------------------------------------------------------------------------------------
def _latlon(x: float, y: float) -> tuple[float, float]:
    """The dataset's convention: lat/lon of a metric point under UTM at origin (0, 0)."""
    from lanelet2 import core, io, projection

    gps = projection.UtmProjector(io.Origin(0.0, 0.0)).reverse(core.BasicPoint3d(x, y, 0.0))
    return gps.lat, gps.lon


def write_map(path: Path) -> Path:
    """The straight two-lane road of the module docstring as Lanelet2 OSM."""
    nodes, ways, relations = [], [], []
    ids = {}

    def node(x: float, y: float) -> int:
        key = (round(x, 3), round(y, 3))
        if key not in ids:
            ids[key] = 1 + len(ids)
            lat, lon = _latlon(x, y)
            nodes.append(f'  <node id="{ids[key]}" visible="true" version="1" lat="{lat!r}" lon="{lon!r}"/>')
        return ids[key]

    def way(wid: int, xs, y: float, subtype: str) -> int:
        refs = "".join(f'<nd ref="{node(x, y)}"/>' for x in xs)
        ways.append(f'  <way id="{wid}" visible="true" version="1">{refs}<tag k="type" v="line_thin"/>'
                    f'<tag k="subtype" v="{subtype}"/></way>')
        return wid

    for k in range(3):
        xs = [X0 + 100.0 * k + d for d in (0.0, 50.0, 100.0)]
        right = way(200 + k, xs, Y0 - LANE_W, "solid")
        centre = way(210 + k, xs, Y0, "dashed")
        left = way(220 + k, xs, Y0 + LANE_W, "solid")
        for lid, lb, rb in ((101 + k, centre, right), (111 + k, left, centre)):
            relations.append(
                f'  <relation id="{lid}" visible="true" version="1">'
                f'<member type="way" ref="{lb}" role="left"/><member type="way" ref="{rb}" role="right"/>'
                '<tag k="type" v="lanelet"/>'
                '<tag k="subtype" v="road"/><tag k="location" v="urban"/><tag k="one_way" v="yes"/>'
                '<tag k="speed_limit" v="50"/></relation>')
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text('<?xml version="1.0"?>\n<osm version="0.6" generator="rad2 tests">\n'
                    + "\n".join(nodes + ways + relations) + "\n</osm>\n")
    return path


def _vehicle(tid, frames, x0, y, speed, length, width, agent_type="car"):
    rows = []
    for f in frames:
        t = (f - frames[0]) * 0.1
        rows.append([tid, f, 100 * f, agent_type, x0 + speed * t, y, speed, 0.0, 0.0, length, width])
    return rows


def vehicle_rows() -> list[list]:
    return (_vehicle(1, FRAMES, X0 + 10.0, Y0 - 1.75, 10.0, 4.6, 1.9)
            + _vehicle(2, FRAMES, X0, Y0 + 1.75, 12.0, 4.4, 1.8)
            + _vehicle(3, FRAMES, X0 + 80.0, Y0 - 1.75, 8.0, 12.0, 2.5, "truck")
            + _vehicle(4, FRAMES, X0 + 150.0, Y0 + 6.0, 0.0, 4.5, 1.8)
            + _vehicle(5, np.arange(120, 151), X0 + 5.0, Y0 - 1.75, 3.0, 4.5, 1.8))


def pedestrian_rows() -> list[list]:
    rows = []
    for tid, speed in (("P1", 1.2), ("P2", 5.0)):
        for f in FRAMES[:100]:
            rows.append([tid, f, 100 * f, "pedestrian/bicycle", X0 + 20.0 + speed * (f - 1) * 0.1,
                         Y0 - 5.5, speed, 0.0])
    return rows


def _fmt(v) -> str:
    if isinstance(v, (float, np.floating)):
        return repr(round(float(v), 3))
    return str(int(v)) if isinstance(v, np.integer) else str(v)


def write_csv(path: Path, columns, rows) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(",".join(columns) + "\n" + "".join(",".join(_fmt(v) for v in r) + "\n" for r in rows))
    return path


def make_dataset(root: Path, location: str = LOCATION, number: str = "000", rows=None, pedestrians=True
                 ) -> Path:
    """The dataset's layout under ``root``; returns the vehicle track file."""
    if not (root / "maps" / f"{location}.osm").exists():
        write_map(root / "maps" / f"{location}.osm")
    folder = root / "recorded_trackfiles" / location
    csv_path = write_csv(folder / f"vehicle_tracks_{number}.csv", VEHICLE_COLUMNS,
                         vehicle_rows() if rows is None else rows)
    if pedestrians:
        write_csv(folder / f"pedestrian_tracks_{number}.csv", PEDESTRIAN_COLUMNS, pedestrian_rows())
    return csv_path


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("interaction")
    make_dataset(root)
    return root


@pytest.fixture(scope="module")
def track_file(dataset) -> Path:
    return dataset / "recorded_trackfiles" / LOCATION / "vehicle_tracks_000.csv"


@pytest.fixture(scope="module")
def clips(track_file):
    errors: list[str] = []
    out = list(iter_interaction_clips(track_file, PARAMS, egos_per_scenario=10, errors=errors))
    return out, errors


def _row_line(rows, tid, frame) -> int:
    """The CSV line (header = line 1) of track ``tid`` at ``frame``."""
    return 2 + next(i for i, r in enumerate(rows) if r[0] == tid and r[1] == frame)


# ------------------------------------------------------------------------------------------------------
# the map and the clips
# ------------------------------------------------------------------------------------------------------
def test_the_map_is_read_in_the_tracks_metric_frame(track_file):
    assert find_map(track_file) == track_file.parents[2] / "maps" / f"{LOCATION}.osm"
    lane_map, _ = load_location_map(find_map(track_file), PARAMS)
    assert lane_map.lane_ids.tolist() == [101, 102, 103, 111, 112, 113]
    idx = lane_map.lane_index()
    # UTM at origin (0, 0) gives back the metres the lat/lon were made from (to well below a centimetre)
    np.testing.assert_allclose(lane_map.centerlines[idx[101]][[0, -1]], [[1000, 998.25], [1100, 998.25]],
                               atol=5e-3)
    np.testing.assert_allclose(lane_map.centerlines[idx[113]][[0, -1]], [[1200, 1001.75], [1300, 1001.75]],
                               atol=5e-3)
    assert {int(s) for s in lane_map.successors[idx[111]]} == {112}
    assert lane_map.neighbor(101, "left") == 111 and lane_map.lane_change_left[idx[101]]
    assert lane_map.speed_limits[idx[102]] == pytest.approx(50 / 3.6)


def test_the_promoted_egos_best_first_and_the_refused(clips):
    out, errors = clips
    # 2 travels farthest, then 1; the truck (3) and the parked car (4) are never promoted; 5 is too short
    assert [c.metadata["ego_track_id"] for c in out] == [2, 1]
    assert len(errors) == 1 and "ego track 5" in errors[0] and "track too short" in errors[0]
    assert "3.0 s" in errors[0] and "min_duration_s" in errors[0]
    ids = [c.clip_id for c in out]
    assert ids == [f"interaction_{LOCATION}_000_ego2_t100", f"interaction_{LOCATION}_000_ego1_t100"]
    for c in out:
        assert c.metadata["source"] == "interaction" and c.metadata["promoted_ego"]
        assert c.metadata["location"] == LOCATION and c.metadata["track_file"] == "vehicle_tracks_000.csv"
        assert c.dt == pytest.approx(SIM_DT)
        # a window of the clip length the project uses (150 frames, 15 s) out of the 20 s tracks
        assert c.duration_s == pytest.approx(14.9, abs=SIM_DT)


def test_ego_and_agents_match_the_csv(clips):
    c = clips[0][0]  # ego 2: left lane from x 1000 at 12 m/s, frames 1..150
    t = np.arange(c.num_steps) * c.dt
    np.testing.assert_allclose(c.ego_x, X0 + 12.0 * t, atol=1e-3)
    np.testing.assert_allclose(c.ego_y, Y0 + 1.75, atol=1e-3)
    np.testing.assert_allclose(c.ego_yaw, 0.0, atol=1e-9)
    np.testing.assert_allclose(c.ego_speed, 12.0, atol=1e-6)
    assert (c.ego_length, c.ego_width) == pytest.approx((4.4, 1.8))
    ids = c.agent_ids.tolist()
    assert 2 not in ids and 5 in ids  # 5 is logged within the window (frames 120..150)
    assert sorted(ids) == [1, 3, 4, 5, PEDESTRIAN_ID_OFFSET + 1, PEDESTRIAN_ID_OFFSET + 2]
    k = ids.index(1)
    assert c.agent_valid[k].all()
    np.testing.assert_allclose(c.agent_x[k], X0 + 10.0 + 10.0 * t, atol=1e-3)
    np.testing.assert_allclose(c.agent_vx[k], 10.0, atol=1e-6)
    assert (c.agent_length[k], c.agent_width[k]) == pytest.approx((4.6, 1.9))
    k = ids.index(3)
    assert c.agent_types[k] == AGENT_VEHICLE and c.agent_length[k] == pytest.approx(12.0)
    k = ids.index(5)  # frames 120..150 of the file are steps 119..149 of the clip
    assert np.flatnonzero(c.agent_valid[k]).tolist() == list(range(119, 150))
    np.testing.assert_allclose(c.agent_x[k, 119], X0 + 5.0, atol=1e-3)
    walker, rider = ids.index(PEDESTRIAN_ID_OFFSET + 1), ids.index(PEDESTRIAN_ID_OFFSET + 2)
    assert c.agent_types[walker] == AGENT_PEDESTRIAN and c.agent_types[rider] == AGENT_CYCLIST
    sizes = PARAMS["adapters"]["default_box_sizes"]
    assert c.agent_length[walker] == pytest.approx(sizes["pedestrian"][0])
    assert c.agent_length[rider] == pytest.approx(sizes["cyclist"][0])
    assert np.flatnonzero(c.agent_valid[walker]).tolist() == list(range(100))  # pedestrian frames 1..100
    np.testing.assert_allclose(c.agent_x[rider, :100], X0 + 20.0 + 5.0 * t[:100], atol=1e-3)
    np.testing.assert_allclose(c.agent_yaw[rider, :100], 0.0, atol=1e-9)  # heading of its velocity


def test_a_heading_logged_against_the_motion_is_turned(tmp_path):
    # car 2's psi_rad says west while it drives east at 12 m/s: mislabelled, not reversing
    rows = [r[:8] + [np.pi] + r[9:] if r[0] == 2 else r for r in vehicle_rows()]
    clip = next(iter_interaction_clips(make_dataset(tmp_path, rows=rows), PARAMS, ego_track_ids=[2]))
    np.testing.assert_allclose(np.cos(clip.ego_yaw), 1.0, atol=1e-9)
    np.testing.assert_allclose(clip.ego_speed, 12.0, atol=1e-6)  # forwards, not -12 m/s
    # a car slowly backing out against its heading (1.5 m/s) keeps it
    backing = _vehicle(6, FRAMES, X0 + 60.0, Y0 - 1.75, -1.5, 4.5, 1.8)
    clip = next(iter_interaction_clips(make_dataset(tmp_path / "b", rows=vehicle_rows() + backing), PARAMS,
                                       ego_track_ids=[2]))
    k = clip.agent_ids.tolist().index(6)
    np.testing.assert_allclose(clip.agent_yaw[k], 0.0, atol=1e-9)


def test_the_route_runs_along_the_ego_lane(clips):
    for c, lanes, y in ((clips[0][0], [111, 112, 113], Y0 + 1.75), (clips[0][1], [101, 102, 103], Y0 - 1.75)):
        assert c.route_lane_ids.tolist() == lanes
        poly = np.asarray(c.route_polyline)
        np.testing.assert_allclose(poly[:, 1], y, atol=1e-2)
        assert poly[0, 0] <= c.ego_x[0] + 1e-6 and poly[-1, 0] >= c.ego_x[-1]


def test_an_ego_chosen_by_track_id_and_a_sibling_map(tmp_path):
    flat = tmp_path / "flat"
    write_csv(flat / "vehicle_tracks_007.csv", VEHICLE_COLUMNS, vehicle_rows())
    write_map(flat / "my_road.osm")  # the only .osm beside the file
    c = load_interaction_clip(flat / "vehicle_tracks_007.csv", PARAMS, ego_track_id=1)
    assert c.clip_id == "interaction_flat_007_ego1_t100" and c.metadata["ego_track_id"] == 1
    assert c.agent_ids.tolist() == [2, 3, 4, 5]  # no pedestrian file here
    with pytest.raises(InteractionFormatError, match=r"ego tracks \[3\]: not vehicles that may be promoted"):
        load_interaction_clip(flat / "vehicle_tracks_007.csv", PARAMS, ego_track_id=3)


# ------------------------------------------------------------------------------------------------------
# recognition and rad2 data convert
# ------------------------------------------------------------------------------------------------------
def test_the_format_is_recognised_by_the_header(dataset, track_file, tmp_path):
    assert "interaction" in FORMATS
    assert track_file_kind(track_file) == "vehicle" and log_format(track_file) == "interaction"
    ped = track_file.with_name("pedestrian_tracks_000.csv")
    assert track_file_kind(ped) == "pedestrian" and log_format(ped) is None  # read with its vehicle file
    other = tmp_path / "vehicle_tracks_000.csv"
    other.write_text("a,b,c\n1,2,3\n")
    assert log_format(other) is None  # the name alone is not enough
    sources = find_logs(dataset)
    assert [(s.format, s.path) for s in sources] == [("interaction", track_file)]
    assert find_logs(dataset, formats=["interaction"]) == sources
    with pytest.raises(LogFormatError, match="no log of the formats"):
        find_logs(dataset, formats=["commonroad"])


def test_clip_ids_are_unique_across_files_and_locations(tmp_path):
    root = tmp_path / "multi"
    for loc in ("LOC_A", "LOC_B"):
        for number in ("000", "001"):
            make_dataset(root, loc, number, pedestrians=False)
    out = tmp_path / "ds"
    written, index, errors = convert_logs(root, out, PARAMS, egos_per_scenario=2, progress=False)
    assert written == 8 and index["num_clips"] == 8 and errors == []
    ids = [c["clip_id"] for c in index["clips"]]
    assert len(set(ids)) == 8
    assert "interaction_LOC_B_001_ego1_t100" in ids


def _cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "rad2_bringup.cli", "data", "convert", *map(str, args),
                           "--no-progress"], capture_output=True, text=True, timeout=300, cwd=cwd)


def test_rad2_data_convert_end_to_end(dataset, tmp_path):
    out = tmp_path / "ds"
    res = _cli(dataset, "--format", "interaction", "--egos-per-scenario", "2", "--out", out)
    assert res.returncode == 0, res.stderr
    assert "2 clips written" in res.stdout
    clips = load_dataset(out)
    assert sorted(c.clip_id for c in clips) == [f"interaction_{LOCATION}_000_ego1_t100",
                                                f"interaction_{LOCATION}_000_ego2_t100"]
    # with more egos than qualify, the short track is refused and named, the rest converted
    res = _cli(dataset, "--egos-per-scenario", "5", "--skip-bad", "--out", tmp_path / "ds5")
    assert res.returncode == 0, res.stderr
    assert "skipped 1" in res.stderr and "ego track 5" in res.stderr and "track too short" in res.stderr
    assert len(load_dataset(tmp_path / "ds5")) == 2


# ------------------------------------------------------------------------------------------------------
# refusals
# ------------------------------------------------------------------------------------------------------
def _edit(rows, tid, frame, column, value):
    rows = [list(r) for r in rows]
    k = next(i for i, r in enumerate(rows) if r[0] == tid and r[1] == frame)
    rows[k][VEHICLE_COLUMNS.index(column)] = value
    return rows


def _bad_rows(case):
    rows = vehicle_rows()
    if case == "nan":
        return _edit(rows, 2, 40, "x", "nan"), (2, 40), "x 'nan'", "is not finite"
    if case == "text":
        return _edit(rows, 1, 7, "vy", "fast"), (1, 7), "vy 'fast'", "is not a number"
    if case == "speed":
        return _edit(rows, 3, 12, "vx", 1e6), (3, 12), "vx '1000000.0'", "a speed of 1e+06 m/s"
    if case == "far":
        return _edit(rows, 4, 90, "y", 1.0e7), (4, 90), "y 10000000.0", "outside the map's lanes"
    if case == "frames":  # track 1's row of frame 51 says frame 50 again
        return _edit(rows, 1, 51, "frame_id", 50), (1, 50), "frame_id '50'", "is not after the frame_id 50"
    if case == "timestamp":
        return (_edit(rows, 2, 60, "timestamp_ms", 6050), (2, 60), "timestamp_ms 6050",
                "does not match frame_id 60")
    if case == "length":
        return _edit(rows, 4, 1, "length", 1e5), (4, 1), "length '100000.0'", "is outside"
    raise AssertionError(case)


BAD = ("nan", "text", "speed", "far", "frames", "timestamp", "length")


@pytest.mark.parametrize("case", BAD)
def test_a_malformed_row_is_named_by_file_line_field_and_value(tmp_path, case):
    rows, (tid, frame), field, what = _bad_rows(case)
    path = make_dataset(tmp_path, rows=rows, pedestrians=False)
    line = _row_line(vehicle_rows(), tid, frame)
    if case == "frames":
        line += 1  # the row after frame 50 of track 1
    with pytest.raises(InteractionFormatError) as info:
        list(iter_interaction_clips(path, PARAMS, egos_per_scenario=2, errors=[]))
    msg = str(info.value)
    assert info.value.reason == "malformed row"
    assert msg.startswith(f"{path}: line {line}: {field}") and what in msg, msg
    # --skip-bad lists the file and goes on; without it a clear error, no traceback
    good = make_dataset(tmp_path, "OTHER_Road", pedestrians=False)
    written, _, errors = convert_logs(tmp_path, tmp_path / "ds", PARAMS, skip_bad=True, progress=False)
    assert written == 1 and len(errors) == 1 and errors[0] == msg
    assert good.exists()
    res = _cli(path, "--out", tmp_path / "ds2")
    assert res.returncode == 1 and "Traceback" not in res.stderr
    assert f"line {line}: {field}" in res.stderr and what in res.stderr


def test_a_pedestrian_file_row_is_named_too(tmp_path):
    path = make_dataset(tmp_path)
    ped = path.with_name("pedestrian_tracks_000.csv")
    rows = pedestrian_rows()
    rows[3][5] = "inf"  # P1, frame 4, y
    write_csv(ped, PEDESTRIAN_COLUMNS, rows)
    expected = "^" + re.escape(f"{ped}: line 5: y 'inf': is not finite")
    with pytest.raises(InteractionFormatError, match=expected):
        list(iter_interaction_clips(path, PARAMS))


def test_a_missing_map_is_refused(tmp_path):
    path = make_dataset(tmp_path, pedestrians=False)
    shutil.rmtree(tmp_path / "maps")
    with pytest.raises(InteractionFormatError) as info:
        list(iter_interaction_clips(path, PARAMS))
    assert info.value.reason == "missing map"
    assert f"missing map: no Lanelet2 map of location '{LOCATION}'" in str(info.value)
    assert str(tmp_path / "maps" / f"{LOCATION}.osm") in str(info.value)
    res = _cli(path, "--out", tmp_path / "ds")
    assert res.returncode == 1 and "Traceback" not in res.stderr and "missing map" in res.stderr
    res = _cli(path, "--out", tmp_path / "ds", "--skip-bad")
    assert res.returncode == 1 and "skipped 1" in res.stderr and "missing map" in res.stderr
    assert "no clip converted" in res.stderr


def test_an_ego_too_short_or_off_every_lane_is_refused(tmp_path):
    short = make_dataset(tmp_path / "short", rows=_vehicle(9, np.arange(1, 41), X0 + 5.0, Y0 - 1.75, 10.0,
                                                            4.5, 1.8), pedestrians=False)
    with pytest.raises(InteractionFormatError) as info:
        list(iter_interaction_clips(short, PARAMS))
    assert info.value.reason == "track too short"
    assert "ego track 9" in str(info.value) and "logged 3.9 s, a clip needs 5 s" in str(info.value)
    # a car driving 30 m north of the road, beside the map's lanes for all of its track
    off = make_dataset(tmp_path / "off", rows=_vehicle(8, FRAMES, X0, Y0 + 30.0, 10.0, 4.5, 1.8),
                       pedestrians=False)
    errors: list[str] = []
    assert list(iter_interaction_clips(off, PARAMS, errors=errors)) == []
    assert len(errors) == 1 and errors[0].startswith(f"{off}: ego track 8 (from 0.1 s): off every lane: ")
    assert "none of its 200 logged positions" in errors[0] and "(1000.0, 1030.0)" in errors[0]
    res = _cli(off, "--out", tmp_path / "ds")
    assert res.returncode == 1 and "Traceback" not in res.stderr and "off every lane" in res.stderr
    # a car that leaves the road after 3 s: on the lanelets too briefly for a clip
    rows = _vehicle(7, FRAMES, X0 + 270.0, Y0 - 1.75, 10.0, 4.5, 1.8)
    off_end = make_dataset(tmp_path / "off_end", rows=rows, pedestrians=False)
    with pytest.raises(InteractionFormatError, match="off every lane: on the map's lanelets for at most 3.0 s"
                       ) as info:
        list(iter_interaction_clips(off_end, PARAMS))
    assert info.value.reason == "off every lane"


def test_a_file_with_no_car_to_promote(tmp_path):
    path = make_dataset(tmp_path, rows=_vehicle(3, FRAMES, X0, Y0 - 1.75, 8.0, 12.0, 2.5, "truck"),
                        pedestrians=False)
    with pytest.raises(InteractionFormatError, match="no ego: no track is a moving car"):
        list(iter_interaction_clips(path, PARAMS))


def test_a_car_whose_box_overlaps_another_is_not_promoted(tmp_path):
    # 6 drives 3 m behind 1 (boxes 4.6 m long): the log itself collides, so 6 is no ego, nor is 1
    rows = vehicle_rows() + _vehicle(6, FRAMES, X0 + 7.0, Y0 - 1.75, 10.0, 4.5, 1.8)
    path = make_dataset(tmp_path, rows=rows, pedestrians=False)
    assert [c.metadata["ego_track_id"] for c in iter_interaction_clips(path, PARAMS, egos_per_scenario=3,
                                                                       errors=[])] == [2]
    alone = make_dataset(tmp_path / "alone", rows=[r for r in rows if r[0] in (1, 6)], pedestrians=False)
    with pytest.raises(InteractionFormatError, match="no ego: the logged box of every moving car overlaps"):
        list(iter_interaction_clips(alone, PARAMS, errors=[]))


# ------------------------------------------------------------------------------------------------------
# the real sample (evaluation only: converted into tmp_path, never into the repository)
# ------------------------------------------------------------------------------------------------------
@pytest.mark.skipif(not (REAL / "maps").is_dir(), reason=f"the INTERACTION sample is not at {REAL}")
def test_the_real_sample_converts(tmp_path):
    track = REAL / "recorded_trackfiles" / "DR_USA_Roundabout_FT" / "vehicle_tracks_000.csv"
    out = tmp_path / "ds"
    written, index, errors = convert_logs(track, out, PARAMS, egos_per_scenario=3, limit=2, skip_bad=True,
                                          progress=False)
    assert written == 2 and index["num_clips"] == 2
    for c in load_dataset(out):
        assert c.metadata["source"] == "interaction" and c.metadata["location"] == "DR_USA_Roundabout_FT"
        assert c.num_agents > 0 and len(c.route_lane_ids) > 0
        assert math.isclose(c.dt, SIM_DT)
        # the ego is on the map's lanes (the map frame is the tracks')
        lane_xy = np.concatenate(c.map.centerlines)
        d = np.min(np.hypot(lane_xy[:, 0] - c.ego_x[0], lane_xy[:, 1] - c.ego_y[0]))
        assert d < 5.0
