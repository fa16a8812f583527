"""Plausibility validators: every impossible-but-finite input of the safety review is rejected with its
field named, and real logged driving (observations, odometry, the expert's own future path) passes."""

from types import SimpleNamespace

import numpy as np
import pytest
from rad2_core import validators as val
from rad2_core.bev import snapshot_from_clip
from rad2_core.bicycle import VehicleParams
from rad2_core.config import load_merged, load_params
from rad2_core.geometry import world_to_ego
from rad2_core.observation import build_observation
from rad2_core.storage import load_dataset
from rad2_planner.policy import resolve_path

PARAMS = load_merged()

LOG_PARAMS = load_merged("bev", "sim", "validators")

BEV = load_params("bev")
VEHICLE_PARAMS = load_params("vehicle")
LIMITS = val.load_limits(load_params("validators"))
VEHICLE = VehicleParams.from_params(load_params("vehicle"))
CHANNELS = list(load_params("bev")["bev"]["channels"])


def _motion(**kw):
    base = dict(x=100.0, y=50.0, yaw=0.3, speed=12.0, yaw_rate=0.05, stamp_ns=10_000_000_000)
    base.update(kw)
    return SimpleNamespace(**base)


def _fields(violations):
    return {v.field.split("[")[0] for v in violations}


@pytest.fixture(scope="module")
def clips():
    return load_dataset(resolve_path("data/eval_safety"))[:4]


def test_odometry_impossible_values_are_named():
    assert val.check_odometry(_motion(), LIMITS) == []
    assert _fields(val.check_odometry(_motion(speed=1e6), LIMITS)) == {"speed"}
    assert _fields(val.check_odometry(_motion(yaw_rate=1e9), LIMITS)) == {"yaw_rate"}
    assert _fields(val.check_odometry(_motion(stamp_ns=0), LIMITS)) == {"stamp_ns"}
    prev = _motion()
    later = dict(stamp_ns=prev.stamp_ns + 100_000_000)  # 0.1 s later
    assert val.check_odometry(_motion(x=101.2, **later), LIMITS, prev) == []  # 12 m/s
    assert _fields(val.check_odometry(_motion(x=1100.0, **later), LIMITS, prev)) == {"pose_jump"}  # 1 km
    hard = val.check_odometry(_motion(speed=30.0, x=101.2, **later), LIMITS, prev)  # +18 m/s in 0.1 s
    assert _fields(hard) == {"acceleration"}
    assert _fields(val.check_odometry(_motion(stamp_ns=prev.stamp_ns), LIMITS, prev)) == {"stamp_ns"}
    err = val.check_odometry(_motion(speed=1e6), LIMITS)[0]
    assert "speed = 1e+06" in str(err) and "60" in str(err)
    with pytest.raises(val.PlausibilityError, match="odometry: speed"):
        val.require_plausible("odometry", [err])


def test_real_logged_drives_pass_every_check(clips):
    """No false rejections: each clip's odometry sequence, observations and future path are plausible."""
    for clip in clips:
        prev = None
        for t in range(0, clip.num_steps, 5):
            m = _motion(x=clip.ego_x[t], y=clip.ego_y[t], yaw=clip.ego_yaw[t], speed=clip.ego_speed[t],
                        yaw_rate=0.0, stamp_ns=int((t + 1) * clip.dt * 1e9))
            assert val.check_odometry(m, LIMITS, prev) == [], (clip.clip_id, t)
            prev = m
        for t in (0, clip.num_steps // 2, clip.num_steps - 41):  # 4 s of logged future
            obs = build_observation(snapshot_from_clip(clip, t, BEV, VEHICLE_PARAMS), params=BEV)
            assert val.check_bev(obs.bev, CHANNELS, LIMITS) == [], (clip.clip_id, t)
            assert val.check_tokens(obs, LIMITS) == [], (clip.clip_id, t)
            steps = t + np.arange(1, 9) * 5  # 8 points at 0.5 s
            fut = world_to_ego(np.stack([clip.ego_x[steps], clip.ego_y[steps]], -1), clip.ego_pose(t))
            got = val.check_trajectory(fut, 0.5, LIMITS, VEHICLE, ego_speed=clip.ego_speed[t])
            assert got == [], (clip.clip_id, t, [str(v) for v in got])


def test_objects_and_features_out_of_range(clips):
    ok = dict(length=[4.5, 0.8], width=[1.9, 0.6], vx=[10.0, 1.0], vy=[0.0, 0.5], x=[20.0, 5.0], y=[0.0, 3.0])
    assert val.check_objects(**ok, limits=LIMITS) == []
    assert _fields(val.check_objects(**{**ok, "length": [0.0, 0.8]}, limits=LIMITS)) == {"objects.length"}
    assert _fields(val.check_objects(**{**ok, "vx": [1e4, 1.0]}, limits=LIMITS)) == {"objects.speed"}
    assert _fields(val.check_objects(**{**ok, "x": [1e6, 5.0]}, limits=LIMITS)) == {"objects.distance"}
    obs = build_observation(snapshot_from_clip(clips[0], 20, BEV, VEHICLE_PARAMS), params=BEV)
    bev = obs.bev.copy()
    bev[CHANNELS.index("drivable_area"), 3, 4] = 1e30
    bev[CHANNELS.index("agent_velocity_x"), 5, 5] = -500.0
    got = val.check_bev(bev, CHANNELS, LIMITS)
    assert _fields(got) == {"bev.drivable_area", "bev.agent_velocity_x"}
    tokens = obs.copy()
    tokens.ego_state = np.array([1e6, 1e7, 0.0, 0.0], np.float32)
    assert _fields(val.check_tokens(tokens, LIMITS)) == {"ego_state.speed", "ego_state.accel"}
    # reversing at 30 m/s: beyond the reverse limit, named with it
    tokens = obs.copy()
    tokens.ego_state = np.array([-30.0, 0.0, 0.0, 0.0], np.float32)
    got = val.check_tokens(tokens, LIMITS)
    assert _fields(got) == {"ego_state.speed"} and "reverse limit" in got[0].bound
    # empty scene tokens: no polyline, no route
    tokens = obs.copy()
    tokens.map_mask = np.zeros_like(obs.map_mask)
    tokens.route_mask = np.zeros_like(obs.route_mask)
    assert {"map_polylines.count", "route.count"} <= _fields(val.check_tokens(tokens, LIMITS))


def test_trajectory_point_limit():
    veh = VEHICLE
    n = int(LIMITS["trajectory"]["max_points"])
    pts = np.stack([0.1 * np.arange(1, 10_001), np.zeros(10_000)], -1)
    got = val.check_trajectory(pts, 0.1, LIMITS, veh)
    assert _fields(got) == {"trajectory.points"} and got[0].value == 10_000 and str(n) in got[0].bound
    assert val.check_trajectory(pts[:n], 0.1, LIMITS, veh) == []


def _straight(v=10.0, dt=0.5, n=8):
    return np.stack([v * dt * np.arange(1, n + 1), np.zeros(n)], -1)


def test_trajectory_faults_of_the_safety_review():
    good = _straight()
    assert val.check_trajectory(good, 0.5, LIMITS, VEHICLE, ego_speed=10.0) == []
    arc = np.stack([30 * np.sin(np.arange(1, 9) * 0.15), 30 * (1 - np.cos(np.arange(1, 9) * 0.15))], -1)
    assert val.check_trajectory(arc, 0.5, LIMITS, VEHICLE, ego_speed=9.0) == []  # R = 30 m at 9 m/s
    cases = {
        "trajectory.dt": dict(dt=1000.0),
        "trajectory.dt ": dict(dt=1e-6),
        "trajectory.speed": dict(points=np.vstack([good[:-1], [[1e6, 0.0]]])),
        "trajectory.start_offset": dict(points=good + [0.0, 100.0]),
        "trajectory.backward": dict(points=-good),
        "trajectory.accel": dict(points=np.zeros((8, 2)), ego_speed=15.0),  # an all-zero path at 15 m/s
        "trajectory.points": dict(points=good[:1]),
    }
    for name, change in cases.items():
        kw = dict(points=good, dt=0.5, ego_speed=10.0)
        kw.update(change)
        got = val.check_trajectory(kw["points"], kw["dt"], LIMITS, VEHICLE, ego_speed=kw["ego_speed"])
        assert name.strip() in _fields(got), (name, [str(v) for v in got])
    # a stopped car may plan to stay where it is
    assert val.check_trajectory(np.zeros((8, 2)), 0.5, LIMITS, VEHICLE, ego_speed=0.0) == []


def test_plan_deviation_from_the_previous_plan():
    prev = _straight()
    shifted = prev[1:] + [0.0, 0.2]  # the next cycle, 0.5 s later, 0.2 m to the side
    assert val.check_plan_deviation(shifted, 0.5, 0.5, prev, 0.0, 0.5, LIMITS) == []
    jumped = prev[1:] + [0.0, 20.0]
    got = val.check_plan_deviation(jumped, 0.5, 0.5, prev, 0.0, 0.5, LIMITS)
    assert _fields(got) == {"trajectory.deviation_from_previous"} and got[0].value == pytest.approx(20.0)


def test_a_log_of_the_impossible_is_refused_before_it_is_driven(clips):
    """check_clip: the bundled clips and the real-world fixtures (AV2, CommonRoad's highway, whose
    logged acceleration reaches 18 m/s²) pass; a finite impossible log is named field by
    field, and the simulator refuses to drive it."""
    import dataclasses

    from bev_warp_sim.simulator import Simulator
    from bev_warp_sim.state import SimulationError
    from rad2_bringup.cli.bench_bev import _fixture_clips

    for clip in [*clips, *_fixture_clips(LOG_PARAMS)]:
        found = val.check_clip(clip, LIMITS)
        assert found == [], (clip.clip_id, [str(v) for v in found])
    c = clips[0]
    jump = c.ego_x.copy()
    jump[40:] += 500.0  # a 500 m teleport between two 0.1 s steps
    bad = {
        "clip.ego_speed": dataclasses.replace(c, ego_speed=np.full_like(c.ego_speed, 1e6)),
        "clip.ego_x": dataclasses.replace(c, ego_x=c.ego_x + 1e9),
        "clip.ego_step": dataclasses.replace(c, ego_x=jump),
        "clip.ego_length": dataclasses.replace(c, ego_length=500.0),
        "clip.agent_length": dataclasses.replace(c, agent_length=np.full_like(c.agent_length, 1e5)),
        "clip.agent_speed": dataclasses.replace(c, agent_vx=np.where(c.agent_valid, 1e6, c.agent_vx)),
        "clip.agent_y": dataclasses.replace(c, agent_y=np.where(c.agent_valid, -1e9, c.agent_y)),
    }
    for name, clip in bad.items():
        assert name in _fields(val.check_clip(clip, LIMITS)), name
    # an agent's state outside its valid steps is padding, not a claim about the world
    padded = dataclasses.replace(c, agent_vx=np.where(c.agent_valid, c.agent_vx, 1e6))
    assert val.check_clip(padded, LIMITS) == []
    sim = Simulator(PARAMS)
    with pytest.raises(SimulationError, match=r"not a drivable log: clip.ego_speed\[0\] = 1e\+06"):
        sim.init(bad["clip.ego_speed"])
    sim.init(c)  # the same simulator still drives a real log


def test_log_readers_drop_a_tracker_glitch_and_refuse_an_impossible_ego(clips):
    """adapters.logs.plausible_clip (every real-log reader's last step): one agent state at 1e6 m/s is
    marked invalid and counted, an agent with a 1e5 m box loses all its states, the clip is kept and
    then passes check_clip; an ego at 1e6 m/s is refused, naming the log and the field."""
    import dataclasses

    from rad2_datasets.adapters.logs import LogFormatError, plausible_clip

    c = clips[0]
    i, t = np.argwhere(c.agent_valid)[0]
    vx = c.agent_vx.copy()
    vx[i, t] = 1e6
    length = c.agent_length.copy()
    j = int(np.argwhere(c.agent_valid.any(axis=1))[-1, 0])
    length[j] = 1e5
    cleaned = plausible_clip(dataclasses.replace(c, agent_vx=vx, agent_length=length), "log.parquet",
                             LOG_PARAMS)
    want = 1 + int(c.agent_valid[j].sum()) - int(j == i and c.agent_valid[j, t])
    assert cleaned.metadata["implausible_agent_states"] == want
    assert not cleaned.agent_valid[i, t] and not cleaned.agent_valid[j].any()
    assert val.check_clip(cleaned, LIMITS) == []
    assert plausible_clip(c, "log.parquet", LOG_PARAMS) is c  # a clean log is handed on untouched
    with pytest.raises(LogFormatError, match=r"log.parquet: clip .* logs the impossible: clip.ego_speed"):
        plausible_clip(dataclasses.replace(c, ego_speed=np.full_like(c.ego_speed, 1e6)), "log.parquet",
                       LOG_PARAMS)
