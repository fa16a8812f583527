"""Traffic signals: the rule layer's geometry and decisions, and the closed loop (the ego stops at red
and goes at green with the shipped planner; without the layer it runs the red, and the metric says so)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from rad2_core.config import load_merged, load_params
from rad2_core.lane_map import SIGNAL_GREEN, SIGNAL_RED, SIGNAL_UNKNOWN, SIGNAL_YELLOW
from rad2_core.stop_lines import NO_STOP_M, next_signal_stop, stop_line_crossings, stop_lines_on_route
from rad2_planner.traffic_rules import TrafficRuleParams, allowed_distance, limit_progress
from synthetic_scenes import make_signal_clip

PARAMS = load_merged()

RULES = TrafficRuleParams.from_params(load_params("planner"))
LINE_X = 70.0


@pytest.fixture(scope="module")
def clip():
    return make_signal_clip(red_steps=80, stop_line_x=LINE_X)


def test_stop_line_is_found_on_the_route_with_its_state(clip):
    lines = stop_lines_on_route(clip.map, clip.route_lane_ids, clip.route_polyline)
    assert len(lines) == 1 and lines[0][0] == 0
    pose = clip.ego_pose(0)  # centre at x = 20 on the straight
    red = next_signal_stop(clip.map, clip.signals_at(0), clip.route_lane_ids, clip.route_polyline, pose,
                           clip.ego_length)
    assert red[1] == SIGNAL_RED and red[0] == pytest.approx(LINE_X - pose[0], abs=0.05)
    green = next_signal_stop(clip.map, clip.signals_at(100), clip.route_lane_ids, clip.route_polyline, pose,
                             clip.ego_length)
    assert green[0] == NO_STOP_M and green[1] == SIGNAL_UNKNOWN
    # a line the front has passed is behind the ego, whatever its state
    past = np.array([LINE_X + 1.0, pose[1], pose[2]])
    assert next_signal_stop(clip.map, clip.signals_at(0), clip.route_lane_ids, clip.route_polyline, past,
                            clip.ego_length)[0] == NO_STOP_M
    # a signal that controls no route lane is a crossing street's: not the ego's
    other = replace(clip.map, signal_lanes=[[3]])
    other.map_id = other.content_hash()  # another map: ids are content hashes
    assert next_signal_stop(other, clip.signals_at(0), clip.route_lane_ids, clip.route_polyline, pose,
                            clip.ego_length)[0] == NO_STOP_M


def test_decisions_red_yellow_dilemma_and_standing():
    length, margin = 4.8, RULES.stop_margin_m
    red = np.array([50.0, SIGNAL_RED])
    assert allowed_distance(red, 10.0, length, RULES) == pytest.approx(50.0 - length / 2 - margin)
    # yellow: obeyed when a comfortable stop fits, else proceed
    assert allowed_distance(np.array([50.0, SIGNAL_YELLOW]), 10.0, length, RULES) is not None
    assert allowed_distance(np.array([12.0, SIGNAL_YELLOW]), 13.0, length, RULES) is None
    # red appearing when stopping needs more than max_decel: too late, proceed
    assert allowed_distance(np.array([6.0, SIGNAL_RED]), 15.0, length, RULES) is None
    # a late stop rolling inside the margin still stops at the line itself; over the line it clears
    inside = np.array([length / 2 + 0.5 * margin, SIGNAL_RED])
    assert allowed_distance(inside, 1.0, length, RULES) == pytest.approx(1.0 / (2 * RULES.max_decel))
    # ... and a crawl a few centimetres before the margin is not taken for the dilemma zone
    crawl = np.array([length / 2 + margin + 0.01, SIGNAL_RED])
    assert allowed_distance(crawl, 0.46, length, RULES) == pytest.approx(0.46**2 / (2 * RULES.max_decel))
    assert allowed_distance(np.array([length / 2 - 0.2, SIGNAL_RED]), 1.0, length, RULES) is None
    # standing at the line: stay; green / none / disabled: no constraint
    assert allowed_distance(np.array([length / 2 + 0.5, SIGNAL_RED]), 0.0, length, RULES) == 0.0
    assert allowed_distance(np.array([50.0, SIGNAL_GREEN]), 10.0, length, RULES) is None
    assert allowed_distance(np.array([NO_STOP_M, SIGNAL_RED]), 10.0, length, RULES) is None
    assert allowed_distance(red, 10.0, length, replace(RULES, enabled=False)) is None


def test_limit_progress_keeps_the_path_and_never_overtakes_the_plan():
    t = (np.arange(8) + 1) * 0.5
    plan = np.stack([10.0 * t, 0.02 * (10.0 * t) ** 2], -1)  # a gentle left curve at 10 m/s
    out = limit_progress(plan, 0.5, 10.0, 20.0, RULES.comfort_decel)
    path = np.vstack([[0.0, 0.0], out])
    s = np.concatenate([[0.0], np.cumsum(np.linalg.norm(np.diff(path, axis=0), axis=1))])
    assert s[-1] <= 20.0 + 1e-6 and np.all(np.diff(s) >= -1e-9)
    own_steps = np.linalg.norm(np.diff(np.vstack([[0, 0], plan]), axis=0), axis=1)
    own = np.concatenate([[0.0], np.cumsum(own_steps)])
    assert np.all(s <= own + 1e-6)  # never ahead of the generated plan
    from rad2_core.tokens import project_onto_polyline

    own_path = np.vstack([[0.0, 0.0], plan])
    assert max(project_onto_polyline(own_path, q)[1] for q in out) < 1e-6  # on the plan's own path
    assert np.allclose(limit_progress(plan, 0.5, 10.0, 100.0, RULES.comfort_decel), plan)  # far line: as is
    assert np.allclose(limit_progress(plan, 0.5, 0.0, 0.0, RULES.comfort_decel), 0.0)  # stand still


def test_crossing_a_red_line_is_detected(clip):
    front_a, front_b = np.array([LINE_X - 0.5, 0.0]), np.array([LINE_X + 0.5, 0.0])
    assert stop_line_crossings(clip.map, clip.signals_at(0), clip.route_lane_ids, front_a, front_b) == [5]
    assert stop_line_crossings(clip.map, clip.signals_at(100), clip.route_lane_ids, front_a, front_b) == []
    assert stop_line_crossings(clip.map, clip.signals_at(0), clip.route_lane_ids, front_a,
                               front_a + [0.3, 0.0]) == []


def _drive(clip, rules_enabled: bool):
    from bev_warp_sim.metrics import episode_outcome
    from bev_warp_sim.rollout import BatchedPolicy, run_rollouts
    from bev_warp_sim.simulator import Simulator
    from rad2_planner.policy import Rad2Policy

    params = load_params("planner")
    params = {**params, "traffic_rules": {**params["traffic_rules"], "enabled": rules_enabled}}
    policy = Rad2Policy.from_params({**PARAMS, **params})
    sim = Simulator(PARAMS)
    (rollout,), _ = run_rollouts(sim, BatchedPolicy(policy), [clip], max_steps=130)
    return rollout.trace, episode_outcome(rollout.trace, sim.params)


def test_closed_loop_stops_at_red_and_goes_at_green(clip):
    trace, result = _drive(clip, True)
    ego = np.asarray(trace.ego)
    front = ego[:, 0] + 0.5 * clip.ego_length * np.cos(ego[:, 2])
    red = slice(0, 80)  # trace index k is log step k (the rollout starts at step 0)
    assert front[red].max() <= LINE_X, f"front reached {front[red].max():.2f} m during red (line {LINE_X})"
    assert ego[79, 3] < 0.3, f"still moving at {ego[79, 3]:.2f} m/s when the light turned green"
    assert front[-1] > LINE_X + 10.0, f"did not go at green: front at {front[-1]:.1f} m"
    assert result.red_light_violations == 0 and not trace.red_light_crossings
    # without the rule layer the same planner runs the red light, and the metric records it
    trace_off, result_off = _drive(clip, False)
    assert result_off.red_light_violations >= 1 and trace_off.red_light_crossings[0][1] == 5


def test_signals_reach_the_planner_through_the_ros_messages(clip):
    """Vehicle path: PerceptionInputs.signals -> LiveScene -> SceneTokens.signal_stop -> the planner's
    Observation; states the map does not know are reported, a stale report becomes unknown."""
    from rad2_core.bev import AgentFrame
    from rad2_datasets.live_scene import LiveScene, MapAndRoute
    from rad2_msgs.msg import PerceptionInputs
    from rad2_ros import conversions as rc

    no_agents = rc.perception_inputs_from_msg(PerceptionInputs())[0]
    msg = rc.perception_inputs_to_msg(no_agents, 1, signals={5: SIGNAL_RED, 99: SIGNAL_GREEN})
    signals = rc.perception_signals_from_msg(msg)
    assert signals == {5: SIGNAL_RED, 99: SIGNAL_GREEN}
    msg.signals[0].state = 7
    with pytest.raises(rc.MessageValidationError, match=r"signals\[0\].state"):
        rc.perception_signals_from_msg(msg)

    params = {**load_params("bev"), **load_params("vehicle")}
    nodes = load_params("nodes")["perception"]
    scene = LiveScene(MapAndRoute(clip.map, clip.route_polyline, clip.route_lane_ids, "test"), params, 0.1,
                      nodes["history_s"], nodes["odom_max_age_s"], nodes["history_tolerance_s"])
    stamp = 100.0
    scene.add_odometry(stamp, clip.ego_x[0], clip.ego_y[0], clip.ego_yaw[0], clip.ego_speed[0], 0.0)
    empty = np.zeros(0)
    scene.add_objects(stamp, AgentFrame.from_arrays(empty.astype(int), empty.astype(int), *([empty] * 7)))
    assert scene.add_signals(stamp, signals) == [99]
    obs = scene.observation(stamp)
    assert obs.signal_stop[1] == SIGNAL_RED
    assert obs.signal_stop[0] == pytest.approx(LINE_X - clip.ego_x[0], abs=0.1)
    tokens = rc.scene_tokens_from_msg(rc.scene_tokens_to_msg(rc.SceneTokenArrays.from_observation(obs, 1)),
                                      rc.SceneTokenArrays.from_observation(obs).sizes)
    np.testing.assert_allclose(tokens.signal_stop, obs.signal_stop, atol=1e-4)
    assert scene.signals_at(stamp + nodes["history_s"] + 0.1) is None  # not heard from: unknown
    bad = rc.scene_tokens_to_msg(rc.SceneTokenArrays.from_observation(obs, 1))
    bad.signal_stop_state = 9
    with pytest.raises(rc.MessageValidationError, match="signal_stop_state"):
        rc.scene_tokens_from_msg(bad, tokens.sizes)
