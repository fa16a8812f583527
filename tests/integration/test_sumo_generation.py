"""SUMO scenario generation: conventions, lane maps, determinism and the injected near-misses."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("libsumo")
pytest.importorskip("sumolib")

from bev_warp_sim import safety  # noqa: E402
from rad2_core.config import load_all, load_params  # noqa: E402
from rad2_core.storage import load_dataset  # noqa: E402
from rad2_datasets.scenarios import events, networks  # noqa: E402
from rad2_datasets.scenarios import generate as gen  # noqa: E402
from rad2_datasets.scenarios.runner import sumo_to_center  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
PARAMS = load_all(("scenarios", "vehicle", "sim"))
GEN = gen.generation_params(PARAMS)
CFG = load_params("scenarios")["scenarios"]
SIM = load_params("sim")
THRESHOLD = float(CFG["safety"]["near_miss_ttc_s"])
TRACKS = ("ego_x", "ego_y", "ego_yaw", "ego_speed", "ego_accel", "agent_ids", "agent_length", "agent_width",
          "agent_x", "agent_y", "agent_yaw", "agent_vx", "agent_vy", "agent_valid", "route_lane_ids",
          "route_polyline")


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("sumo_networks")


def test_sumo_pose_conversion():
    # heading 90 deg clockwise from north = east = yaw 0; the centre is half a length behind the bumper
    x, y, yaw = sumo_to_center(10.0, 5.0, 90.0, 4.0)
    assert yaw == pytest.approx(0.0, abs=1e-12)
    assert (x, y) == pytest.approx((8.0, 5.0))
    x, y, yaw = sumo_to_center(0.0, 0.0, 0.0, 4.0)  # north
    assert yaw == pytest.approx(np.pi / 2)
    assert (x, y) == pytest.approx((0.0, -2.0), abs=1e-12)
    x, y, yaw = sumo_to_center(0.0, 0.0, 180.0, 5.0)  # south
    assert yaw == pytest.approx(-np.pi / 2)
    assert (x, y) == pytest.approx((0.0, 2.5), abs=1e-12)
    _, _, yaw = sumo_to_center(0.0, 0.0, 270.0, 4.0)  # west: wrapped to +pi
    assert yaw == pytest.approx(np.pi)


def test_live_vehicle_centre_and_heading(cache):
    """A vehicle driving east on the motorway: yaw ~ 0, centre = lane start + lane position - length/2."""
    import libsumo

    spec = networks.network_specs(CFG["networks"], "highway")[0]
    net_file = networks.build_network(spec, cache)
    geom = networks.read_lane_geometry(net_file)
    lane = "main0_1"
    k = geom.index()[lane]
    routes = cache / "one.rou.xml"
    routes.write_text(
        '<routes><vType id="t" length="5.0" width="2.0" sigma="0"/><route id="r" edges="main0 main1"/>'
        '<vehicle id="v" type="t" route="r" depart="0" departLane="1" departPos="20"/></routes>'
    )
    libsumo.start([networks.sumo_binary("sumo"), "-n", str(net_file), "-r", str(routes),
                   "--step-length", "0.1", "--no-step-log", "true"])
    try:
        for _ in range(30):
            libsumo.simulationStep()
        fx, fy = libsumo.vehicle.getPosition("v")
        x, y, yaw = sumo_to_center(fx, fy, libsumo.vehicle.getAngle("v"), 5.0)
        pos = libsumo.vehicle.getLanePosition("v")
        assert libsumo.vehicle.getLaneID("v") == lane
    finally:
        libsumo.close()
    assert yaw == pytest.approx(0.0, abs=1e-6)
    start = geom.centerlines[k][0]
    assert x == pytest.approx(start[0] + pos - 2.5, abs=0.05)
    assert y == pytest.approx(start[1], abs=0.05)


def test_lane_map_of_highway(cache):
    spec = networks.network_specs(CFG["networks"], "highway")[0]
    geom = networks.read_lane_geometry(networks.build_network(spec, cache))
    lm = gen.convert.lane_map_from_geometry(geom)
    lm.validate()
    idx = geom.index()
    # eastbound lane: the left boundary is north of the centreline, by half the lane width
    k = idx["main0_0"]
    assert np.allclose(geom.left_boundaries[k][:, 1] - geom.centerlines[k][:, 1], 1.6, atol=0.05)
    assert np.allclose(geom.right_boundaries[k][:, 1] - geom.centerlines[k][:, 1], -1.6, atol=0.05)
    # routes are continuous through junctions: lane -> internal lane -> next edge's lane, end meets start
    (via,) = geom.successors[k]
    assert geom.sumo_lane_ids[via].startswith(":")
    (nxt,) = geom.successors[via]
    assert geom.sumo_lane_ids[nxt] == "main1_1"
    assert np.linalg.norm(geom.centerlines[k][-1] - geom.centerlines[via][0]) < 0.5
    assert np.linalg.norm(geom.centerlines[via][-1] - geom.centerlines[nxt][0]) < 0.5
    assert lm.speed_limits[k] == pytest.approx(CFG["networks"]["highway"]["speed_mps"])


def _actor_ttc(clip) -> np.ndarray:
    keep = np.isin(clip.agent_ids, np.asarray(clip.metadata["event"]["actor_ids"], dtype=np.int64))
    return safety.min_ttc_of_log(clip.select_agents(keep), SIM)["ttc"]


@pytest.mark.parametrize("kind,seed", [("hard_brake", 11), ("cut_in", 12), ("crossing_conflict", 13),
                                       ("pull_out", 14)])
def test_safety_event_gives_near_miss_without_collision(kind, seed, cache):
    res = gen.generate_clip(kind, seed, log_safety=safety.min_ttc_of_log, cache_dir=cache, **GEN)
    assert res.clip is not None, f"{kind}: every attempt rejected {res.rejections}"
    clip = res.clip.validate()
    meta = clip.metadata
    assert meta["source"] == "sumo" and meta["scenario_kind"] == kind and meta["seed"] == seed
    assert meta["network_kind"] in CFG["kinds"][kind]["networks"]
    assert clip.num_steps == CFG["sim"]["clip_steps"] and clip.dt == pytest.approx(0.1)
    # no ego-agent box overlap anywhere in the log (oriented boxes, the simulator's own check)
    full = safety.min_ttc_of_log(clip, SIM)
    assert full["collisions"] == []
    assert meta["min_ttc"] == pytest.approx(full["min_ttc"], abs=1e-3)
    # the injected actor is in the log and produces the near-miss once the event has started
    trig = meta["event"]["trigger_step"]
    assert trig is not None and 0 <= trig < clip.num_steps
    actor = np.asarray(meta["event"]["actor_ids"])
    assert len(actor) == 1 and np.isin(actor, clip.agent_ids).all()
    ttc = _actor_ttc(clip)
    assert ttc.min() < THRESHOLD
    assert ttc[max(trig - 20, 0):].min() < THRESHOLD
    # the logged ego stays within the vehicle limits
    vehicle = load_params("vehicle")["vehicle"]
    assert clip.ego_accel.min() >= float(vehicle["min_accel"]) - 1e-6
    # ego centre on its route polyline (lane changes aside), route beyond the logged end
    from shapely.geometry import LineString, Point

    line = LineString(clip.route_polyline)
    d = [line.distance(Point(x, y)) for x, y in zip(clip.ego_x, clip.ego_y)]
    assert max(d) < 2.0
    assert line.length - line.project(Point(clip.ego_x[-1], clip.ego_y[-1])) > 20.0


def test_same_seed_same_clip_different_seed_different(cache):
    a, b, c = (
        gen.generate_clip("cut_in", seed, log_safety=safety.min_ttc_of_log, cache_dir=cache, **GEN).clip
        for seed in (21, 21, 22)
    )
    assert a is not None and b is not None and c is not None
    for name in TRACKS:
        assert np.array_equal(getattr(a, name), getattr(b, name)), name
    assert json.dumps(a.metadata, sort_keys=True) == json.dumps(b.metadata, sort_keys=True)
    assert a.map.map_id == b.map.map_id
    assert not (a.ego_x.shape == c.ego_x.shape and np.array_equal(a.ego_x, c.ego_x))


def test_dataset_generation_shares_maps(tmp_path, cache):
    rep = gen.generate_dataset(tmp_path / "ds", ["free_road", "slow_leader"], 3, seed=5,
                               log_safety=safety.min_ttc_of_log, cache_dir=cache, progress=False,
                               params=PARAMS)
    clips = load_dataset(tmp_path / "ds")
    assert rep["clips"] == len(clips) == 3
    assert {c.scenario_kind for c in clips} == {"free_road", "slow_leader"}
    maps = list((tmp_path / "ds" / "maps").glob("*.npz"))
    assert len(maps) == len({c.map.map_id for c in clips}) <= 3
    assert (tmp_path / "ds" / "generation_report.json").is_file()


def test_dataset_generation_reads_no_parameter_file(tmp_path, cache, monkeypatch):
    """A run takes the values its entry point loaded and hands them to its jobs: it reads no file of
    params/ itself (an edit of params/ during the run changes nothing in it)."""
    from rad2_core import config

    def no_read(*args, **kwargs):
        raise AssertionError("params/ read during the run")

    monkeypatch.setattr(config, "load_params", no_read)
    rep = gen.generate_dataset(tmp_path / "ds", ["free_road"], 2, seed=7, log_safety=safety.min_ttc_of_log,
                               params=PARAMS, cache_dir=cache, progress=False)
    assert rep["clips"] == 2


def test_bad_inputs_are_named():
    with pytest.raises(ValueError, match="teleport"):
        gen.plan_jobs(["teleport"], 3, 0)
    with pytest.raises(ValueError, match="count"):
        gen.plan_jobs(["free_road"], 0, 0)
    with pytest.raises(ValueError, match="maze"):
        networks.network_specs(CFG["networks"], "maze")
    with pytest.raises(ValueError, match="offset_polyline"):
        networks.offset_polyline(np.zeros((1, 2)), 1.0)
    with pytest.raises(ValueError, match="not one of"):
        gen.generate_clip("teleport", 1, log_safety=safety.min_ttc_of_log, **GEN)


@pytest.mark.parametrize("name,kinds,minimum", [
    ("eval_safety", events.SAFETY_KINDS, 50),
    ("eval_efficiency", events.EFFICIENCY_KINDS, 50),
    ("train", events.BUNDLED_KINDS, 150),
])
def test_bundled_sets(name, kinds, minimum):
    """The committed data/ sets load without SUMO, cover their kinds and keep the near-miss property."""
    directory = ROOT / "data" / name
    if not (directory / "index.json").is_file():
        pytest.skip(f"{directory} not generated yet (rad2 data generate --bundled)")
    clips = load_dataset(directory)
    assert len(clips) >= minimum
    assert {c.scenario_kind for c in clips} == set(kinds)
    for c in clips:
        c.validate()
        assert c.metadata["source"] == "sumo"
        if c.scenario_kind in events.SAFETY_KINDS:
            assert c.metadata["actor_min_ttc"] < THRESHOLD


@pytest.mark.parametrize("seed", [100, 105])
def test_junction_start_rests_then_drives_through_the_junction(seed, cache):
    """junction_start: the logged ego is at rest at step 0, a few metres before a junction, and pulls away at
    once (no wait the clip cannot explain); a turn clip turns by more than 60 degrees within 6 s, a
    straight one by less than 30. Seeds 100 and 105 give one of each with the shipped settings."""
    res = gen.generate_clip("junction_start", seed, log_safety=safety.min_ttc_of_log, cache_dir=cache, **GEN)
    clip = res.clip
    assert clip is not None, res.rejections
    ev = clip.metadata["event"]["params"]
    assert clip.ego_speed[0] < 0.1
    assert clip.ego_speed[10] > 1.0  # moving within 1 s
    assert np.all(np.diff(clip.ego_speed[:10]) >= -1e-6)
    heading_change = abs(np.unwrap(clip.ego_yaw)[60] - clip.ego_yaw[0])
    if ev["turn"]:
        assert ev["direction"] in events.TURN_DIRECTIONS
        assert heading_change > np.radians(60)
    else:
        assert ev["direction"] == "s"
        assert heading_change < np.radians(30)
    lo, hi = CFG["events"]["junction_start"]["stop_gap_m"]
    assert lo <= ev["stop_gap_m"] <= hi


def test_junction_start_turn_fraction_is_checked():
    bad = {"stop_gap_m": [1.0, 5.0], "turn_fraction": 1.5}
    cfg = {**CFG, "events": {**CFG["events"], "junction_start": bad}}
    with pytest.raises(ValueError, match="turn_fraction"):
        events.make_event("junction_start", cfg, np.random.default_rng(0))


def test_signalised_grid_exports_light_states_the_logged_driver_obeys(cache):
    """--signals: one map signal per signalised link (stop line across the junction lane's start), the
    logged states per step; SUMO's own ego never crosses a red line on its route, and the same seed
    without --signals gives the map the bundled sets were generated with."""
    from rad2_core.lane_map import SIGNAL_GREEN, SIGNAL_RED
    from rad2_core.stop_lines import stop_line_crossings, stop_lines_on_route

    res = gen.generate_clip("free_road", 20260101, log_safety=safety.min_ttc_of_log, cache_dir=cache,
                            network_kind="grid", signals=True, **GEN)
    clip = res.clip
    assert clip is not None and clip.map.num_signals > 0
    assert clip.signal_states.shape == (clip.map.num_signals, clip.num_steps)
    assert set(np.unique(clip.signal_states)) & {SIGNAL_RED, SIGNAL_GREEN}
    assert stop_lines_on_route(clip.map, clip.route_lane_ids, clip.route_polyline)
    front = np.stack([clip.ego_x + 0.5 * clip.ego_length * np.cos(clip.ego_yaw),
                      clip.ego_y + 0.5 * clip.ego_length * np.sin(clip.ego_yaw)], -1)
    for t in range(1, clip.num_steps):
        states = clip.signals_at(t)
        assert not stop_line_crossings(clip.map, states, clip.route_lane_ids, front[t - 1], front[t])
    plain = gen.generate_clip("free_road", 20260101, log_safety=safety.min_ttc_of_log, cache_dir=cache,
                              network_kind="grid", **GEN).clip
    assert plain.map.num_signals == 0 and plain.signal_states is None
    np.testing.assert_array_equal(plain.ego_x, clip.ego_x)
