"""The headway statistics of logged drivers (rad2_evaluation.headway) on small straight-road clips built
here: exact gaps, time gaps, closing speeds and TTC; who is and is not a leader; cut-ins; refusals."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pytest
from rad2_core.clip import AGENT_PEDESTRIAN, AGENT_VEHICLE, Clip
from rad2_core.lane_map import LaneMap
from rad2_evaluation.headway import (
    HeadwayAccumulator,
    HeadwayInputError,
    HeadwayParams,
    accumulate,
    clip_headway,
    clip_tracks,
    find_leaders,
    path_frame,
    summarize,
)

LANE = 3.5
DT = 0.1
EGO_LEN, EGO_WID = 4.8, 1.9


def _map() -> LaneMap:
    """Two lanes eastbound along y = 0 and y = 3.5, x from -100 to 600."""
    cl = [np.array([[-100.0, y], [600.0, y]]) for y in (0.0, LANE)]
    return LaneMap.build(
        lane_ids=[1, 2], centerlines=cl,
        left_boundaries=[c + [0.0, LANE / 2] for c in cl], right_boundaries=[c - [0.0, LANE / 2] for c in cl],
        speed_limits=[30.0, 30.0], successors=[[], []])


def _clip(agents: list[dict], steps: int = 60, ego_v: float = 10.0, ego_y=0.0, ego_vy: float = 0.0,
          clip_id: str = "headway_test", metadata: dict | None = None) -> Clip:
    """The ego at x = 0 heading east at ``ego_v`` (y = ``ego_y``, moving sideways at ``ego_vy``), and
    agents, each {x, y, v (along its yaw), yaw, vy (sideways, world), length, width, type, first}
    moving at constant velocity."""
    t = np.arange(steps) * DT
    n = len(agents)
    ax, ay, ayaw, avx, avy = (np.zeros((n, steps)) for _ in range(5))
    valid = np.zeros((n, steps), bool)
    for i, a in enumerate(agents):
        yaw = a.get("yaw", 0.0)
        vx = a["v"] * math.cos(yaw)
        vy = a["v"] * math.sin(yaw) + a.get("vy", 0.0)
        ax[i] = a["x"] + vx * t
        ay[i] = a.get("y", 0.0) + vy * t
        ayaw[i] = yaw
        avx[i], avy[i] = vx, vy
        valid[i, a.get("first", 0):] = True
    for arr in (ax, ay, ayaw, avx, avy):
        arr[~valid] = 0.0
    ey = ego_y + ego_vy * t
    return Clip.build(
        clip_id=clip_id, dt=DT, ego_x=ego_v * t, ego_y=ey, ego_yaw=np.zeros(steps),
        ego_speed=np.full(steps, ego_v), ego_accel=np.zeros(steps), ego_length=EGO_LEN, ego_width=EGO_WID,
        agent_ids=np.arange(10, 10 + n), agent_types=[a.get("type", AGENT_VEHICLE) for a in agents],
        agent_length=[a.get("length", 4.6) for a in agents],
        agent_width=[a.get("width", 1.8) for a in agents],
        agent_x=ax, agent_y=ay, agent_yaw=ayaw, agent_vx=avx, agent_vy=avy, agent_valid=valid, map=_map(),
        route_lane_ids=[1], route_polyline=np.array([[-100.0, 0.0], [600.0, 0.0]]),
        metadata={"source": "synthetic", **(metadata or {})}).validate()


def test_a_follower_at_a_known_gap_gives_the_exact_time_gap_closing_speed_and_ttc():
    # the ego at 10 m/s, 30 m (centres) behind a car at 8 m/s; a third car 20 m behind the ego at 12 m/s
    clip = _clip([{"x": 30.0, "v": 8.0, "length": 4.6}, {"x": -20.0, "v": 12.0, "length": 4.0}])
    tr = clip_tracks(clip)
    lead = find_leaders(tr, HeadwayParams())
    t = np.arange(clip.num_steps) * DT
    assert np.all(lead.index[0] == 1) and np.all(lead.index[2] == 0) and np.all(lead.index[1] == -1)
    np.testing.assert_allclose(lead.gap_m[0], 30.0 - 2.0 * t - EGO_LEN / 2 - 4.6 / 2, atol=1e-9)
    np.testing.assert_allclose(lead.gap_m[2], 20.0 - 2.0 * t - 4.0 / 2 - EGO_LEN / 2, atol=1e-9)
    np.testing.assert_allclose(lead.leader_speed[0], 8.0, atol=1e-9)

    one = clip_headway(clip)
    s = one.samples
    ego = s["speed"] == 10.0  # the ego's samples (the follower behind it drives at 12 m/s)
    gap = 30.0 - 2.0 * t - 4.7
    np.testing.assert_allclose(s["gap_m"][ego], gap, atol=1e-9)
    np.testing.assert_allclose(s["time_gap_s"][ego], gap / 10.0, atol=1e-9)
    np.testing.assert_allclose(s["closing_mps"][ego], 2.0, atol=1e-9)
    np.testing.assert_allclose(s["ttc_s"][ego], gap / 2.0, atol=1e-9)
    np.testing.assert_allclose(s["required_decel"][ego], 4.0 / (2.0 * gap), atol=1e-9)
    behind = s["speed"] == 12.0
    assert behind.sum() == clip.num_steps  # every logged vehicle is a follower, not only the ego
    np.testing.assert_allclose(s["ttc_s"][behind], (20.0 - 2.0 * t - 4.4) / 2.0, atol=1e-9)
    # constant speeds: no braking where the smoothing window is logged, NaN at the clip's ends
    assert np.nanmax(np.abs(s["decel"])) < 1e-9 and np.isnan(s["decel"]).sum() > 0


def test_an_opening_gap_has_no_ttc_and_a_slow_follower_no_time_gap():
    clip = _clip([{"x": 20.0, "v": 12.0}], ego_v=1.0)
    s = clip_headway(clip).samples
    assert np.all(s["closing_mps"] < 0) and np.all(np.isnan(s["ttc_s"]))
    assert np.all(np.isnan(s["required_decel"]))
    assert np.all(np.isnan(s["time_gap_s"]))  # 1 m/s is below min_speed
    assert np.all(np.isfinite(s["gap_m"]))


@pytest.mark.parametrize("other", [
    {"x": 20.0, "y": LANE, "v": 10.0},  # the next lane
    {"x": 20.0, "y": -LANE, "v": 10.0},  # the other next lane
    {"x": 40.0, "v": 10.0, "yaw": math.pi},  # oncoming in the ego's own lane
    {"x": 40.0, "y": 0.0, "v": 10.0, "yaw": 0.6},  # crossing at 34 deg
    {"x": 20.0, "v": 1.0, "type": AGENT_PEDESTRIAN, "length": 0.6, "width": 0.6},  # a pedestrian
    {"x": -20.0, "v": 10.0},  # behind
    {"x": 130.0, "v": 10.0},  # beyond max_range_m
])
def test_a_vehicle_in_the_next_lane_oncoming_crossing_behind_or_a_pedestrian_is_no_leader(other):
    clip = _clip([other], steps=20)
    lead = find_leaders(clip_tracks(clip), HeadwayParams())
    assert np.all(lead.index[0] == -1)


def test_a_leader_on_a_bend_is_found_along_the_arc():
    # on a circle of radius 50 m (left bend), a point 30 deg further on lies on the path
    r, th = 50.0, math.radians(30.0)
    along, lateral, turn = path_frame(r * math.sin(th), r - r * math.cos(th), 1.0 / r, 100.0)
    assert along == pytest.approx(r * th) and lateral == pytest.approx(0.0, abs=1e-9)
    assert turn == pytest.approx(th)
    # 1 m inside the bend: 1 m to the left; a right bend is the mirror image
    assert path_frame(0.0 + (r - 1) * math.sin(th), r - (r - 1) * math.cos(th), 1 / r, 100.0)[1] == \
        pytest.approx(1.0)
    along, lateral, _ = path_frame(r * math.sin(th), -(r - r * math.cos(th)), -1.0 / r, 100.0)
    assert along == pytest.approx(r * th) and lateral == pytest.approx(0.0, abs=1e-9)
    # straight: the frame itself
    assert path_frame(12.0, 0.5, 0.0, 100.0)[:2] == (12.0, 0.5)


def test_a_cut_in_is_detected_and_told_from_a_lane_change_of_the_follower():
    # the previous leader 40 m ahead; a car in the left lane 15 m ahead moves across at 1.75 m/s from 1 s
    steps = 70
    mover = {"x": 15.0, "y": LANE, "v": 10.0}
    clip = _clip([{"x": 40.0, "v": 10.0}, mover], steps=steps)
    t = np.arange(steps) * DT
    y = np.where(t < 1.0, LANE, np.maximum(0.0, LANE - 1.75 * (t - 1.0)))
    clip.agent_y[1] = y
    clip.agent_vy[1] = np.gradient(y, DT)
    clip.validate()
    one = clip_headway(clip)
    ego_events = [e for e in one.cut_ins if e["follower"] == 0]
    assert len(ego_events) == 1, one.cut_ins
    e = ego_events[0]
    assert e["leader"] == 2 and e["by_leader"]
    assert e["gap_m"] == pytest.approx(15.0 - EGO_LEN / 2 - 4.6 / 2, abs=0.3)
    assert e["previous_gap_m"] == pytest.approx(40.0 - 4.7, abs=1e-6)
    assert e["time_gap_s"] == pytest.approx(e["gap_m"] / 10.0)
    # the car enters the corridor when its centre is 1.75 m from the ego's path: at t = 2 s
    assert e["step"] == pytest.approx(20, abs=1)

    # the ego moves right from the left lane behind a car in the right lane: its own lane change
    clip = _clip([{"x": 40.0, "y": LANE, "v": 10.0}, {"x": 15.0, "y": 0.0, "v": 10.0}], steps=steps,
                 ego_y=LANE, ego_vy=0.0)
    ey = np.where(t < 1.0, LANE, np.maximum(0.0, LANE - 1.75 * (t - 1.0)))
    clip = replace(clip, ego_y=ey).validate()
    events = [e for e in clip_headway(clip).cut_ins if e["follower"] == 0]
    assert len(events) == 1 and not events[0]["by_leader"]


def test_a_leader_that_falls_away_is_no_cut_in():
    # the nearer car leaves to the next lane: the far one becomes the leader at a larger gap
    steps = 60
    clip = _clip([{"x": 40.0, "v": 10.0}, {"x": 15.0, "v": 10.0, "vy": 1.75}], steps=steps)
    assert [e for e in clip_headway(clip).cut_ins if e["follower"] == 0] == []


def test_steps_logged_in_two_clips_are_counted_once():
    a = _clip([{"x": 30.0, "v": 8.0}], clip_id="scene_a", metadata={"start_time_step": 0})
    b = _clip([{"x": 30.0, "v": 8.0}], clip_id="scene_b", metadata={"start_time_step": 0})
    acc = accumulate([a, b])
    assert acc.arrays()["speed"].size == a.num_steps and acc.duplicate_steps == a.num_steps
    # shifted in the log: a different step of the scene, so counted
    c = _clip([{"x": 30.0, "v": 8.0}], clip_id="scene_c", metadata={"start_time_step": 500})
    acc.add(c)
    assert acc.arrays()["speed"].size == 2 * a.num_steps


def test_the_summary_has_percentiles_per_speed_band_and_the_envelope():
    # the ego 20-41 m behind a car at 9 m/s, at 8-15 m/s: it closes in but never reaches it in 5 s
    clips = [_clip([{"x": 20.0 + 3 * k, "v": 9.0}], ego_v=8.0 + k, clip_id=f"c{k}", steps=50,
                   metadata={"start_time_step": 1000 * k}) for k in range(8)]
    s = summarize(accumulate(clips, HeadwayParams(min_band_samples=50)))
    json.dumps(s, allow_nan=False)  # plain JSON
    bands = {b["band"]: b for b in s["bands"]}
    assert set(bands) == {"0-5", "5-10", "10-15", "15-20", "20+"}
    assert bands["5-10"]["samples"] == 2 * 50 and bands["10-15"]["samples"] == 5 * 50
    assert bands["0-5"]["time_gap_s"]["p5"] is None  # no samples: no figure
    tg = bands["5-10"]["time_gap_s"]
    assert tg["p1"] <= tg["p5"] <= tg["p10"] <= tg["p50"]
    assert s["all"]["closing_mps"]["p99"] == pytest.approx(6.0, abs=0.05)  # 15 m/s behind 9 m/s
    assert sum(e["samples"] for e in s["envelope"]) <= s["following_samples"]
    assert any(e["p99"] is not None for e in s["envelope"])


def _corrupt(field_name: str, value):
    clip = _clip([{"x": 30.0, "v": 8.0}], steps=20)
    arr = getattr(clip, field_name)
    if isinstance(arr, np.ndarray):
        arr = arr.copy()
        arr.flat[min(3, arr.size - 1)] = value
        return replace(clip, **{field_name: arr})
    return replace(clip, **{field_name: value})


@pytest.mark.parametrize("field_name,value", [
    ("agent_x", math.nan),
    ("ego_speed", math.inf),
    ("ego_speed", 1e6),
    ("agent_vx", 500.0),
    ("agent_length", 80.0),
    ("ego_width", 12.0),
    ("dt", 5.0),
])
def test_nan_or_absurd_input_is_refused_naming_the_field(field_name, value):
    with pytest.raises(HeadwayInputError, match=field_name):
        clip_headway(_corrupt(field_name, value))
    with pytest.raises(HeadwayInputError, match="headway_test"):  # and the clip
        HeadwayAccumulator().add(_corrupt(field_name, value))


@pytest.mark.parametrize("kwargs,named", [
    ({"lane_half_width": -1.0}, "params.lane_half_width"),
    ({"min_speed": math.nan}, "params.min_speed"),
    ({"max_heading_deg": 120.0}, "params.max_heading_deg"),
    ({"speed_bands": (0.0, 10.0, 5.0)}, "params.speed_bands"),
])
def test_bad_parameters_are_refused_naming_them(kwargs, named):
    with pytest.raises(HeadwayInputError, match=named):
        clip_headway(_clip([{"x": 30.0, "v": 8.0}], steps=10), HeadwayParams(**kwargs))


def test_the_command_writes_json_and_figure_and_names_a_bad_dataset(tmp_path, capsys):
    from rad2_bringup.cli.data_headway import main
    from rad2_core.storage import save_dataset

    clips = [_clip([{"x": 20.0 + 3 * k, "v": 9.0}], ego_v=8.0 + k, clip_id=f"c{k}", steps=80,
                   metadata={"start_time_step": 1000 * k}) for k in range(3)]
    save_dataset(clips, tmp_path / "ds")
    out = tmp_path / "out"
    argv = ["--data", str(tmp_path / "ds"), "--label", "synthetic", "--out", str(out), "--no-progress"]
    assert main(argv) == 0
    stats = json.loads((out / "headway.json").read_text())["datasets"][0]
    assert stats["label"] == "synthetic" and stats["following_samples"] == 3 * 80
    assert (out / "headway.png").stat().st_size > 1000
    assert "time gap (s)" in capsys.readouterr().out
    with pytest.raises(SystemExit) as done:
        main(["--data", str(tmp_path / "nowhere"), "--out", str(out)])
    assert done.value.code == 2 and "--data" in capsys.readouterr().err
    with pytest.raises(SystemExit) as done:
        main(["--data", str(tmp_path / "ds"), "--label", "a", "b", "--out", str(out)])
    assert done.value.code == 2 and "--label" in capsys.readouterr().err
    with pytest.raises(SystemExit) as done:
        main(["--data", str(tmp_path / "ds"), "--out", str(out), "--lane-half-width", "nan"])
    assert done.value.code == 2 and "'nan'" in capsys.readouterr().err


def test_the_tools_read_their_thresholds_from_params():
    """params/headway.yaml holds the values the command uses; the dataclass's defaults equal them, and
    the file's last speed band is open above."""
    from rad2_core.config import load_params

    from_file = HeadwayParams.from_params(load_params("headway")).validate()
    assert from_file == HeadwayParams()
    assert from_file.speed_bands[-1] == float("inf")
