"""Core supervision logic without ROS: odometry gate, heartbeats, starvation explainer, fault latch,
and the planner's output check (kinematics + deviation from the previous cycle's plan)."""

from __future__ import annotations

import numpy as np
import pytest
from rad2_core.bicycle import VehicleParams
from rad2_core.config import load_params
from rad2_core.supervision import FaultLatch, HeartbeatMonitor, OdometryGate, Seen, explain_starvation
from rad2_core.validators import load_limits
from rad2_planner import planner_guard
from rad2_ros.conversions import EgoMotion as Motion

LIMITS = load_limits(load_params("validators"))
VEHICLE = VehicleParams.from_params(load_params("vehicle"))
MS = 1_000_000




def drive(n: int, t0_ns: int = 10**9, x0: float = 0.0, y0: float = 0.0, v: float = 10.0,
          step_ns: int = 20 * MS):
    return [Motion(x0 + v * k * step_ns / 1e9, y0, 0.0, v, 0.0, t0_ns + k * step_ns) for k in range(n)]


# ---------------------------------------------------------------------------------------------------
# odometry gate
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fault,field", [
    (dict(speed=1e6), "speed"), (dict(yaw_rate=1e9), "yaw_rate"), (dict(stamp_ns=0), "stamp_ns"),
    (dict(x=1000.0), "pose_jump"), (dict(speed=40.0), "acceleration"),
])
def test_gate_rejects_one_bad_sample_and_keeps_the_good_stream(fault, field):
    gate = OdometryGate(LIMITS, confirm_samples=3)
    good = drive(10)
    for m in good[:5]:
        assert gate.offer(m).accepted
    bad = Motion(**{**good[5].__dict__, **fault})
    res = gate.offer(bad)
    assert not res.accepted and res.violations[0].field.startswith(field), res.reason
    assert field in res.reason and "violates" in res.reason
    # the stream goes on where it was: accepted, not a reset
    for m in good[6:]:
        r = gate.offer(m)
        assert r.accepted and not r.reset
    assert gate.rejected_count == 1 and gate.reset_count == 0 and gate.last == good[-1]


def test_gate_accepts_a_confirmed_relocalisation_only():
    gate = OdometryGate(LIMITS, confirm_samples=3)
    for m in drive(5):
        assert gate.offer(m).accepted
    far = drive(5, t0_ns=10**9 + 5 * 20 * MS, x0=5000.0)
    r1, r2, r3 = (gate.offer(m) for m in far[:3])
    assert not r1.accepted and not r2.accepted
    assert r3.accepted and r3.reset and gate.reset_count == 1
    assert gate.offer(far[3]).accepted and not gate.offer(far[4]).reset
    # two far samples that disagree with each other never confirm
    gate2 = OdometryGate(LIMITS, confirm_samples=2)
    for m in drive(3):
        gate2.offer(m)
    t = 10**9 + 3 * 20 * MS
    assert not gate2.offer(Motion(5000.0, 0.0, 0.0, 10.0, 0.0, t)).accepted
    assert not gate2.offer(Motion(-5000.0, 0.0, 0.0, 10.0, 0.0, t + 20 * MS)).accepted
    # stamps going backwards are a clock fault however many agree: never a relocalisation
    gate3 = OdometryGate(LIMITS, confirm_samples=2)
    for m in drive(3, t0_ns=50 * 10**9):
        gate3.offer(m)
    back = drive(4, t0_ns=10**9)
    assert not any(gate3.offer(m).accepted for m in back) and gate3.reset_count == 0
    # the node's own clock going back (a replay loop restarting /clock) starts a new history
    gate4 = OdometryGate(LIMITS, confirm_samples=2)
    for m in drive(3, t0_ns=50 * 10**9):
        assert gate4.offer(m, m.stamp_ns + 10 * MS).accepted
    first = gate4.offer(back[0], back[0].stamp_ns + 10 * MS)
    assert first.accepted and gate4.clock.resets == 1
    with pytest.raises(ValueError):
        OdometryGate(LIMITS, confirm_samples=0)


# ---------------------------------------------------------------------------------------------------
# heartbeats, starvation, latch
# ---------------------------------------------------------------------------------------------------


def test_heartbeat_monitor():
    mon = HeartbeatMonitor({"planner": 0.15, "controller": 0.3})
    assert mon.lost(10**9) == []  # never seen: not lost (reported as not seen)
    st = {s.name: s for s in mon.status(10**9)}
    assert not st["planner"].seen and "no heartbeat" in st["planner"].message
    mon.beat("planner", 10**9)
    mon.beat("stranger", 10**9)  # unknown names are ignored
    assert mon.lost(10**9 + 150 * MS) == []
    lost = mon.lost(10**9 + 151 * MS)
    assert [s.name for s in lost] == ["planner"]
    assert "planner heartbeat lost: 0.151 s" in lost[0].message
    mon.beat("planner", 10**9 + 200 * MS)
    assert mon.lost(10**9 + 210 * MS) == []
    mon.refresh("controller", 10**9)  # output of a node never heard from: no heartbeat obligation
    assert "controller" not in mon.last_ns
    mon.refresh("planner", 10**9 + 300 * MS)  # output of a watched node: alive
    assert mon.lost(10**9 + 400 * MS) == []
    mon.rebase(50 * 10**9)  # the clock jumped: not a loss, but one from there on
    assert mon.lost(50 * 10**9 + 100 * MS) == [] and mon.lost(50 * 10**9 + 200 * MS)


def test_explain_starvation_names_what_is_missing_and_why_unpaired():
    now = 10 * 10**9
    text = explain_starvation(now, None, None, 0.005, None)
    assert "no BEV features received" in text and "no scene tokens received" in text
    tokens_only = explain_starvation(now, None, Seen(now - 50 * MS, now - 40 * MS), 0.005, now - 300 * MS)
    assert "for 0.30 s" in tokens_only and "no BEV features received" in tokens_only
    assert "scene tokens last received 0.04 s ago" in tokens_only
    unpaired = explain_starvation(now, Seen(now - 20 * MS, now - 10 * MS), Seen(now, now), 0.005, now - 10**9)
    assert "unpaired" in unpaired and "20 ms apart > sync tolerance 5 ms" in unpaired
    delayed = explain_starvation(now, Seen(now - 400 * MS, now - 390 * MS),
                                 Seen(now - 200 * MS, now - 190 * MS), 0.005, now - 390 * MS)
    assert "unpaired" in delayed and "partner of the scene tokens" in delayed
    stale_bev = explain_starvation(now, Seen(now - 200 * MS, now - 200 * MS),
                                   Seen(now - 200 * MS, now - 10 * MS), 0.005, now - 200 * MS)
    assert "waiting for new BEV features" in stale_bev
    assert "BEV features last received 0.20 s ago" in stale_bev


def test_fault_latch_reports_a_cleared_fault_once():
    latch = FaultLatch()
    assert not latch and latch.reason() == ""
    latch.raise_fault("odometry", "odometry rejected: speed = 1e+06")
    latch.clear("odometry")  # good input before the next cycle
    assert latch and "speed = 1e+06" in latch.reason()
    assert latch.reason() == "" and not latch
    latch.raise_fault("trajectory", "invalid trajectory: trajectory.dt = 1000")
    assert "trajectory.dt" in latch.reason() and "trajectory.dt" in latch.reason()  # active: every cycle
    latch.clear_all(["trajectory"])
    assert latch.reason() == ""


# ---------------------------------------------------------------------------------------------------
# planner output: kinematics and deviation from the previous cycle's plan
# ---------------------------------------------------------------------------------------------------

DT, T = 0.5, 8
DEV = planner_guard.DeviationCheck(horizon_s=1.0, max_gap_s=0.15, max_speed_gap_m_s=3.0)


def check(points, ego_speed, stamp_ns, previous, limits=LIMITS):
    return planner_guard.check_plan_output(points, DT, ego_speed, limits, VEHICLE, stamp_ns, previous, DEV)


def straight(v: float, y: float = 0.0, n: int = T) -> np.ndarray:
    return np.stack([v * DT * np.arange(1, n + 1), np.full(n, y)], axis=1)


def test_plan_output_accepts_consecutive_plans_and_an_emergency_brake():
    prev = straight(10.0)
    stamp, nxt = 10**9, 10**9 + 100 * MS
    assert check(straight(10.0), 10.0, nxt, (stamp, prev)) == []
    # hard braking at the vehicle's limit replaces a cruising plan: a replanning, not a fault
    t = DT * np.arange(1, T + 1)
    s = np.where(t <= 1.25, 10.0 * t - 0.5 * 8.0 * t**2, 10.0**2 / 16.0)
    brake = np.stack([s, np.zeros(T)], axis=1)
    assert check(brake, 10.0, nxt, (stamp, prev)) == []
    # the previous plan seen from where the ego is 0.1 s later: 1 m further along it
    moved, speed = planner_guard.previous_plan_in_current_frame(prev, DT, 0.1)
    assert speed == pytest.approx(10.0) and moved[0] == pytest.approx([4.0, 0.0])
    turn = np.stack([np.zeros(T), 5.0 * np.arange(1, T + 1)], axis=1)  # heading +y
    moved, _ = planner_guard.previous_plan_in_current_frame(turn, DT, 0.25)
    assert moved[0] == pytest.approx([2.5, 0.0])


def test_plan_output_rejects_lateral_jump_and_implausible_kinematics():
    stamp, nxt = 10**9, 10**9 + 100 * MS
    jump = straight(10.0)
    jump[0, 1], jump[1:, 1] = 4.0, 100.0  # 100 m to the side one step later
    assert planner_guard.check_plan_output(jump, DT, 10.0, LIMITS, VEHICLE, nxt, (stamp, straight(10.0)), DEV)
    fast = straight(1e6 / T)
    assert check(fast, 10.0, nxt, None)[0].field.startswith(
        "trajectory.speed")
    zero = np.zeros((T, 2))  # an all-zero plan at 10 m/s: a jump from the previous plan
    assert [v.field.split("[")[0] for v in check(zero, 10.0, nxt, (stamp, straight(10.0)))] == \
        ["trajectory.deviation_from_previous"]
    # a plan a little faster than the ego is not judged from the ego's speed (the controller does)
    assert check(straight(12.0), 9.0, nxt, None) == []


def test_plan_output_deviation_only_against_the_previous_cycle_at_matching_speed():
    prev = straight(10.0)
    side = straight(10.0)
    side[:, 1] = 0.3 * np.arange(1, T + 1) ** 2  # a gentle curve to the left: kinematically fine
    stamp = 10**9
    lim = {**LIMITS, "trajectory": {**LIMITS["trajectory"], "max_deviation_m": 1.0}}
    res = check(side, 10.0, stamp + 100 * MS, (stamp, prev), lim)
    assert [v.field for v in res] == ["trajectory.deviation_from_previous[1]"], res
    assert res[0].value == pytest.approx(1.2, abs=1e-6)  # at 1 s: (10, 1.2) vs the previous plan at (10, 0)
    # not against an older plan (gap > max_gap_s), nor when the ego's speed is not the previous plan's
    assert check(side, 10.0, stamp + 500 * MS, (stamp, prev), lim) == []
    slow = side * 0.3
    assert check(slow, 3.0, stamp + 100 * MS, (stamp, prev), lim) == []
    # only over the horizon: a plan that departs after 1 s is not compared there
    late = straight(10.0)
    late[3:, 1] = np.linspace(0.5, 3.0, T - 3)
    assert check(late, 10.0, stamp + 100 * MS, (stamp, prev), lim) == []


def test_future_tolerance_follows_the_node_clock():
    assert planner_guard.future_tolerance_s(False, 0.05, 0.5) == 0.05
    assert planner_guard.future_tolerance_s(True, 0.05, 0.5) == 0.5


def test_plan_kinematics_judged_over_the_horizon_impossible_values_everywhere():
    horizon = float(LIMITS["trajectory"]["kinematics_horizon_s"])
    n = int(horizon / DT)
    hook = straight(10.0)
    hook[n:] = [[hook[n - 1, 0] + 0.5, 6.0 * k] for k in range(1, T - n + 1)]  # a hook after the horizon
    assert planner_guard.check_plan_kinematics(hook, DT, LIMITS, VEHICLE, 10.0) == []
    from rad2_core.validators import check_trajectory

    whole = check_trajectory(hook, DT, LIMITS, VEHICLE)
    assert whole and all(int(v.field.split("[")[1][:-1]) >= n - 1 for v in whole), whole  # in the tail
    early = straight(10.0)
    early[2:] = [[early[1, 0] + 0.5, 6.0 * k] for k in range(1, T - 1)]  # the same hook inside it
    assert planner_guard.check_plan_kinematics(early, DT, LIMITS, VEHICLE, 10.0)
    far = straight(10.0)
    far[-1] = [1e6, 0.0]  # a point at 1e6 m at the end: rejected whatever the horizon
    assert [v.field.split("[")[0] for v in planner_guard.check_plan_kinematics(far, DT, LIMITS, VEHICLE, 10.0)
            ][:1] == ["trajectory.speed"]
    assert planner_guard.check_plan_kinematics(straight(10.0), 1000.0, LIMITS, VEHICLE, 10.0)[0].field == \
        "trajectory.dt"


def test_curvature_is_not_judged_across_a_standing_segment():
    """A plan that nearly stops and moves on: the heading of the near-standing segment is noise (here
    it points sideways), so the turn into and out of it is no curvature of the path (a false rejection
    the soak found at low speed); a real kink between two moving segments still is one."""
    from rad2_core.validators import check_trajectory

    pts = np.cumsum([[5.0, 0.0], [5.0, 0.0], [4.0, 0.0], [3.0, 0.0], [2.0, 0.0], [0.0, 0.04], [0.6, 0.0],
                     [0.6, 0.0]], axis=0)
    assert not [v for v in check_trajectory(pts, DT, LIMITS, VEHICLE) if "curvature" in v.field]
    kink = np.cumsum([[2.0, 0.0], [2.0, 0.0], [2.0, 0.0], [0.0, 2.0], [0.0, 2.0], [0.0, 2.0], [0.0, 2.0],
                      [0.0, 2.0]], axis=0)
    assert [v for v in check_trajectory(kink, DT, LIMITS, VEHICLE) if "curvature" in v.field]


def test_first_interval_judges_braking_not_a_faster_start():
    """From the ego's speed to the plan's first interval: a plan starting 2.5 m/s faster (the generator's
    start offset) is tracked within the vehicle's limits, an all-zero plan at 10 m/s is rejected."""
    from rad2_core.validators import check_trajectory

    faster = straight(12.5)
    found = check_trajectory(faster, DT, LIMITS, VEHICLE, ego_speed=10.0)
    assert not [v for v in found if "accel" in v.field]
    zeros = np.zeros((T, 2))
    found = check_trajectory(zeros, DT, LIMITS, VEHICLE, ego_speed=10.0)
    assert [v.field for v in found][:1] == ["trajectory.accel[0]"]
