"""Traffic-light state as a network input: the BEV ``traffic_signal`` channel, the per-lane signal features
of the map tokens, and checkpoints trained before either existed (they are fed what they were trained on,
and can be widened for a fine-tune)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from rad2_core.bev import SIGNAL_CHANNEL_VALUES, get_config, snapshot_from_clip, world_to_pixel_affine
from rad2_core.config import load_params
from rad2_core.lane_map import SIGNAL_GREEN, SIGNAL_RED, SIGNAL_UNKNOWN, SIGNAL_YELLOW, LaneMap
from rad2_core.observation import ObservationError, build_observation
from rad2_core.tokens import MAP_FEATURES, signal_features, signal_state_of_features
from rad2_planner.candidates import observation_inputs
from synthetic_scenes import make_map, make_signal_clip
from tiny_models import randomised_model, tiny_config

STOP_LINE_X = 70.0
BEV = load_params("bev")
VEHICLE = load_params("vehicle")
CHANNEL = get_config(BEV).channel_index("traffic_signal")


@pytest.fixture(scope="module")
def signal_clip():
    return make_signal_clip(red_steps=60, stop_line_x=STOP_LINE_X)


def _cell_value(bev: np.ndarray, pose, xy) -> float:
    u, v = world_to_pixel_affine(pose, get_config(BEV)) @ np.array([xy[0], xy[1], 1.0])
    return float(bev[CHANNEL, int(round(v)), int(round(u))])


def test_bev_channel_draws_the_stop_line_with_the_light_state(signal_clip):
    t_red, t_green = 30, 62
    for t, state in ((t_red, SIGNAL_RED), (t_green, SIGNAL_GREEN)):
        assert signal_clip.signals_at(t)[0] == state
        snap = snapshot_from_clip(signal_clip, t, BEV, VEHICLE)
        obs = build_observation(snap, params=BEV)
        # the stop line crosses the controlled lane at y = 0 (world); the ego is behind it at t_red
        value = _cell_value(obs.bev, snap.ego_pose, (STOP_LINE_X, 0.0))
        assert value == pytest.approx(SIGNAL_CHANNEL_VALUES[state])
        assert set(np.unique(obs.bev[CHANNEL])) <= {0.0, SIGNAL_CHANNEL_VALUES[state]}
    # without logged states nothing is drawn (unknown is not green)
    dark = dataclasses.replace(signal_clip, signal_states=None)
    assert not build_observation(snapshot_from_clip(dark, t_red, BEV, VEHICLE), params=BEV).bev[CHANNEL].any()


def test_map_tokens_carry_the_state_of_each_lanes_light(signal_clip):
    controlled = int(signal_clip.map.lane_index()[1])
    for t, state in ((30, SIGNAL_RED), (120, SIGNAL_GREEN)):
        obs = build_observation(snapshot_from_clip(signal_clip, t, BEV, VEHICLE), params=BEV)
        valid = obs.map_polylines[obs.map_mask]
        feats = valid[:, :, 6:8]
        assert obs.map_polylines.shape[-1] == MAP_FEATURES
        # every lane row holds one state along its points; exactly the controlled lane has the light's
        assert np.all(np.ptp(feats, axis=1) == 0)
        lit = np.flatnonzero(np.abs(feats[:, 0]).sum(1) > 0)
        assert len(lit) == 1, f"step {t}: lanes {lit} carry a signal, expected only lane index {controlled}"
        np.testing.assert_array_equal(feats[lit[0], 0], signal_features(state))


def test_signal_features_round_trip_and_unknown_is_zero():
    for state in (SIGNAL_UNKNOWN, SIGNAL_RED, SIGNAL_YELLOW, SIGNAL_GREEN):
        assert signal_state_of_features(*signal_features(state)) == state
    assert signal_features(SIGNAL_UNKNOWN) == (0.0, 0.0)


def test_a_lane_two_lights_control_obeys_the_more_restrictive():
    base = make_map()
    m = LaneMap.build(
        lane_ids=base.lane_ids, centerlines=base.centerlines, left_boundaries=base.left_boundaries,
        right_boundaries=base.right_boundaries, speed_limits=base.speed_limits, successors=base.successors,
        signal_ids=[5, 6], signal_lanes=[[1], [1, 2]],
        signal_stop_lines=[[[70.0, -1.5], [70.0, 1.5]], [[70.0, -1.5], [70.0, 1.5]]])
    k0, k1 = m.lane_index()[2], m.lane_index()[1]
    states = m.lane_signal_states([SIGNAL_GREEN, SIGNAL_RED])
    assert states[k1] == SIGNAL_RED and states[k0] == SIGNAL_RED
    states = m.lane_signal_states([SIGNAL_YELLOW, SIGNAL_GREEN])
    assert states[k1] == SIGNAL_YELLOW and states[k0] == SIGNAL_GREEN
    assert not m.lane_signal_states(None).any()
    with pytest.raises(ValueError, match="signal_states"):
        m.lane_signal_states([SIGNAL_RED, 9])
    with pytest.raises(ValueError, match="signal_states"):
        m.lane_signal_states([SIGNAL_RED])


def test_a_checkpoint_without_the_signal_inputs_is_fed_what_it_was_trained_on(signal_clip):
    obs = build_observation(snapshot_from_clip(signal_clip, 30, BEV, VEHICLE), params=BEV)
    channels = get_config(BEV).channels
    assert "traffic_signal" in channels
    full = np.zeros((len(channels), 32, 32), np.float32)
    for c in range(len(channels)):
        full[c] = c  # channel c holds the value c, so the selection can be read back
    small = dataclasses.replace(obs, bev=full, map_polylines=obs.map_polylines[:4, :5].copy(),
                                map_mask=obs.map_mask[:4].copy(), agents=obs.agents[:3].copy(),
                                agents_mask=obs.agents_mask[:3].copy(), route=obs.route[:5].copy(),
                                route_mask=obs.route_mask[:5].copy())
    legacy = tiny_config(bev_channels=len(channels) - 1, map_point_dim=6,
                         input_scale={**tiny_config().input_scale,
                                      "map_point": tiny_config().input_scale["map_point"][:6]})
    inputs = observation_inputs(small, legacy, channels)
    # no recorded names: the first C channels, in order, and the first six map features
    np.testing.assert_array_equal(inputs["bev"][0, :, 0, 0], np.arange(len(channels) - 1))
    assert inputs["map_polylines"].shape[-1] == 6
    named = tiny_config(bev_channels=2, bev_channel_names=["traffic_signal", "route"])
    inputs = observation_inputs(small, named, channels)
    np.testing.assert_array_equal(inputs["bev"][0, :, 0, 0],
                                  [channels.index("traffic_signal"), channels.index("route")])
    assert inputs["map_polylines"].shape[-1] == MAP_FEATURES
    with pytest.raises(ObservationError, match="crosswalk"):
        observation_inputs(small, tiny_config(bev_channels=1, bev_channel_names=["crosswalk"]), channels)


def test_widening_a_checkpoint_keeps_what_it_computes_and_learns_the_new_inputs():
    channels = list(get_config(BEV).channels)
    base = tiny_config()
    old_cfg = dataclasses.replace(
        base, bev_channels=len(channels) - 1,
        bev_channel_names=[c for c in channels if c != "traffic_signal"],
        bev_channel_scale=[], map_point_dim=6, input_scale={**base.input_scale,
                                                            "map_point": base.input_scale["map_point"][:6]})
    old = randomised_model(old_cfg, seed=3)
    new_cfg = dataclasses.replace(base, bev_channels=len(channels), bev_channel_names=channels,
                                  bev_channel_scale=[])
    assert not old.takes_inputs_of(new_cfg)
    wide = old.with_inputs_of(new_cfg).eval()
    assert wide.takes_inputs_of(new_cfg)
    g = torch.Generator().manual_seed(0)
    b, sig = 2, channels.index("traffic_signal")
    bev = torch.rand(b, len(channels), 32, 32, generator=g)
    mp = torch.randn(b, 4, 5, MAP_FEATURES, generator=g)
    rest = (torch.ones(b, 4, dtype=torch.bool), torch.randn(b, 3, 10, generator=g),
            torch.ones(b, 3, dtype=torch.bool), torch.randn(b, 5, 4, generator=g),
            torch.ones(b, 5, dtype=torch.bool), torch.rand(b, 4, generator=g))
    keep = [c for c in range(len(channels)) if c != sig]
    with torch.no_grad():
        before = old.encoder(bev[:, keep], mp[..., :6], *rest)[0]
        after = wide.encoder(bev, mp, *rest)[0]
        torch.testing.assert_close(after, before, atol=1e-4, rtol=1e-4)
        # the new inputs have weights (zero now) that a fine-tune can move: changing them changes nothing yet
        bev2 = bev.clone()
        bev2[:, sig] = 1.0
        torch.testing.assert_close(wide.encoder(bev2, mp, *rest)[0], after, atol=1e-4, rtol=1e-4)
    conv = wide.encoder.bev.cnn[0].weight
    assert conv.shape[1] == len(channels) and not conv[:, sig].any()
    conv.grad = None
    wide.train()
    wide.encoder(bev2, mp, *rest)[0].square().sum().backward()
    assert conv.grad[:, sig].abs().sum() > 0


def test_the_bev_validator_bounds_the_signal_channel(signal_clip):
    from rad2_core.validators import check_bev, load_limits

    limits = load_limits(load_params("validators"))
    obs = build_observation(snapshot_from_clip(signal_clip, 30, BEV, VEHICLE), params=BEV)
    channels = get_config(BEV).channels
    assert check_bev(obs.bev, channels, limits) == []
    obs.bev[CHANNEL, 5, 5] = 3.0  # not a light state's value
    names = [v.field for v in check_bev(obs.bev, channels, limits)]
    assert len(names) == 1 and names[0].startswith("bev.traffic_signal")
