"""Rich generated scenes (``--rich``): pedestrians, cyclists, parked cars, lane widths, ego sizes, and
the committed sets staying exactly what they were."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("libsumo")
pytest.importorskip("sumolib")

from bev_warp_sim import safety  # noqa: E402
from rad2_core.clip import AGENT_CYCLIST, AGENT_PEDESTRIAN, AGENT_VEHICLE  # noqa: E402
from rad2_core.config import load_all, load_params  # noqa: E402
from rad2_core.geometry import boxes_overlap  # noqa: E402
from rad2_core.storage import load_dataset  # noqa: E402
from rad2_datasets.scenarios import generate as gen  # noqa: E402
from rad2_datasets.scenarios import rich  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
PARAMS = load_all(("scenarios", "vehicle", "sim"))
GEN = gen.generation_params(PARAMS)
CFG = load_params("scenarios")["scenarios"]
PARKED_BASE = 50_000_000  # convert.agent_int_id: parked<n> -> 50 million + n


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("sumo_networks")


def _committed(name: str, kind: str):
    directory = ROOT / "data" / name
    if not (directory / "index.json").is_file():
        pytest.skip(f"{directory} not generated")
    return next(c for c in load_dataset(directory) if c.scenario_kind == kind)


@pytest.mark.parametrize("name,kind", [("eval_safety", "cut_in"), ("eval_efficiency", "congestion")])
def test_committed_clip_regenerates_exactly(name, kind, cache):
    """Rich scenes draw from a separate stream and a separate lane check: without ``rich`` a committed
    clip comes back bit for bit (cut_in picks an adjacent lane, the check that sidewalks now pass)."""
    committed = _committed(name, kind)
    res = gen.generate_clip(kind, int(committed.metadata["seed"]), log_safety=safety.min_ttc_of_log,
                            cache_dir=cache, **GEN)
    assert res.clip is not None and res.attempts == committed.metadata["attempt"] + 1
    for field in ("ego_x", "ego_y", "ego_speed", "agent_ids", "agent_x", "agent_y", "agent_valid",
                  "agent_types", "route_polyline"):
        new, stored = np.asarray(getattr(res.clip, field)), np.asarray(getattr(committed, field))
        if new.dtype.kind == "f":  # clip files store float32 offsets: equal to their rounding (~1e-5 m)
            np.testing.assert_allclose(new, stored, rtol=0, atol=1e-4, err_msg=field)
        else:
            assert np.array_equal(new, stored), field
    assert res.clip.map.map_id == committed.map.map_id
    assert "rich" not in res.clip.metadata


def _lane_widths(clip) -> np.ndarray:
    m = clip.map
    return np.array([np.linalg.norm(left[len(left) // 2] - right[len(right) // 2])
                     for left, right in zip(m.left_boundaries, m.right_boundaries, strict=True)
                     if len(left) == len(right) and len(left) >= 2])


def test_rich_grid_scene_has_pedestrians_cyclists_parked_cars_and_its_drawn_sizes(cache):
    res = gen.generate_clip("congestion", 10, log_safety=safety.min_ttc_of_log, cache_dir=cache,
                            network_kind="grid", rich=True, **GEN)
    clip = res.clip
    assert clip is not None, res.details
    drawn = clip.metadata["rich"]
    # the ego box and the lane width are the clip's draws, not params/vehicle.yaml / SUMO's default
    assert clip.ego_length == pytest.approx(drawn["ego_length_m"], abs=1e-3)
    assert clip.ego_width == pytest.approx(drawn["ego_width_m"], abs=1e-3)
    assert drawn["lane_width_m"] in [float(w) for w in CFG["rich"]["lane_width_m"]]
    assert np.median(_lane_widths(clip)) == pytest.approx(drawn["lane_width_m"], abs=0.05)
    types = set(np.unique(clip.agent_types).tolist())
    assert {AGENT_VEHICLE, AGENT_PEDESTRIAN} <= types
    peds = clip.agent_types == AGENT_PEDESTRIAN
    assert np.all(np.abs(clip.agent_vx[peds][clip.agent_valid[peds]]) < 2.5)  # walking speeds
    assert np.all(clip.agent_length[peds] < 1.0)
    # parked cars: present the whole clip, never move, never touch the logged ego
    parked = clip.agent_ids >= PARKED_BASE
    assert 0 < parked.sum() <= drawn["parked_count"]
    assert clip.agent_valid[parked].all()
    assert np.ptp(clip.agent_x[parked], axis=1).max() == 0.0 and np.abs(clip.agent_vx[parked]).max() == 0.0
    ego = np.stack([clip.ego_x, clip.ego_y, clip.ego_yaw, np.full(clip.num_steps, clip.ego_length),
                    np.full(clip.num_steps, clip.ego_width)], axis=1)
    cars = np.stack([clip.agent_x[parked, 0], clip.agent_y[parked, 0], clip.agent_yaw[parked, 0],
                     clip.agent_length[parked], clip.agent_width[parked]], axis=1)
    assert not boxes_overlap(ego[:, None], cars[None]).any()
    # a parked car stands beside the lane: its centre is off every lane centreline by more than half a lane
    centre_pts = np.concatenate(clip.map.centerlines)
    gaps = np.min(np.linalg.norm(cars[:, None, :2] - centre_pts[None], axis=-1), axis=1)
    assert gaps.min() > 0.4 * drawn["lane_width_m"]
    assert safety.min_ttc_of_log(clip, load_params("sim"))["collisions"] == []


def test_cyclists_appear_in_the_logs_of_a_rich_set(cache):
    seen = 0
    for seed in range(20, 26):
        res = gen.generate_clip("free_road", seed, log_safety=safety.min_ttc_of_log, cache_dir=cache,
                                network_kind="grid", rich=True, **GEN)
        assert res.clip is not None, res.details
        cyc = res.clip.agent_types == AGENT_CYCLIST
        if cyc.any():
            top = max(float(np.hypot(res.clip.agent_vx[cyc], res.clip.agent_vy[cyc]).max()), 0.0)
            assert top <= float(CFG["rich"]["cyclists"]["speed_mps"][1]) + 0.5
            seen += 1
    assert seen >= 1


def test_nobody_walks_cycles_or_parks_on_the_motorway(cache):
    res = gen.generate_clip("free_road", 3, log_safety=safety.min_ttc_of_log, cache_dir=cache,
                            network_kind="highway", rich=True, **GEN)
    assert res.clip is not None, res.details
    assert res.clip.metadata["rich"]["parked_count"] > 0  # drawn, but there is no kerb to park at
    assert set(np.unique(res.clip.agent_types).tolist()) == {AGENT_VEHICLE}
    assert not (res.clip.agent_ids >= PARKED_BASE).any()
    assert "highway_w" in res.clip.metadata["network"]


def test_rich_parameters_are_checked():
    bad = {**CFG["rich"], "parked": {**CFG["rich"]["parked"], "count": [5, 2]}}
    with pytest.raises(ValueError, match="parked.count"):
        rich.draw_settings(bad, np.random.default_rng(0))
    with pytest.raises(ValueError, match="lane_width_m"):
        rich.draw_settings({**CFG["rich"], "lane_width_m": []}, np.random.default_rng(0))


def test_committed_rich_set():
    """data/eval_rich loads without SUMO and holds what it is for: pedestrians, cyclists, parked cars,
    several lane widths and ego sizes, light states, and scenes of up to about 60 road users."""
    directory = ROOT / "data" / "eval_rich"
    if not (directory / "index.json").is_file():
        pytest.skip(f"{directory} not generated (rad2 data generate --preset eval_rich)")
    clips = load_dataset(directory)
    assert len(clips) >= 30
    assert {c.scenario_kind for c in clips} == set(CFG["presets"]["eval_rich"]["kinds"])
    for c in clips:
        c.validate()
        assert "rich" in c.metadata
    assert sum((c.agent_types == AGENT_PEDESTRIAN).any() for c in clips) >= 10
    assert sum((c.agent_types == AGENT_CYCLIST).any() for c in clips) >= 5
    assert sum((c.agent_ids >= PARKED_BASE).any() for c in clips) >= 10
    assert len({c.metadata["rich"]["lane_width_m"] for c in clips}) >= 3
    assert np.ptp([c.ego_length for c in clips]) > 0.8
    assert max(int(c.agent_valid.sum(0).max()) for c in clips) >= 50
    assert sum(c.signal_states is not None for c in clips) >= 10
