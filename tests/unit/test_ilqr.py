"""iLQR tracker: model Jacobians, tracking accuracy, limits, batching, degenerate references.

Documented tracking bounds (closed loop, re-solving every 0.1 s with warm start, 3 s of driving,
starting on the reference): lateral error <= 0.3 m and speed error <= 0.5 m/s after the first 0.5 s;
the lane change (3.5 m in 3 s) allows 0.4 m lateral error, and stop-and-go (5 m/s² braking to a
standstill, then 2 m/s² away) 0.8 m/s speed error: the 0.5 s plan points cannot represent the
speed-profile corners, so the resampled reference itself rounds them off.
"""

from __future__ import annotations

import numpy as np
import pytest
from rad2_control import ReferenceError, TrackingController, build_reference, shift_controls
from rad2_core.bicycle import VehicleParams, clamp_controls, jacobians, step
from rad2_core.config import load_params

VEHICLE = load_params("vehicle")
MIN_SPEED = load_params("controller")["controller"]["reference"]["min_heading_speed"]

PLAN_DT = 0.5
T_PLAN = 8


@pytest.fixture(scope="module")
def tc():
    return TrackingController(load_params("controller"), VEHICLE)


def plan_from_speed_profile(speed_fn, lateral_fn=None, t0=0.0, n=60):
    """World-frame plan (x along +x) from a speed profile; points at t0 + (k+1)*PLAN_DT."""
    t_fine = np.linspace(0.0, t0 + PLAN_DT * (n + 1), 4000)
    s = np.concatenate([[0.0], np.cumsum(np.diff(t_fine) * speed_fn(t_fine[1:]))])
    tk = t0 + PLAN_DT * np.arange(1, n + 1)
    x = np.interp(tk, t_fine, s)
    y = lateral_fn(tk) if lateral_fn is not None else np.zeros_like(tk)
    return np.stack([x, y], -1)


def closed_loop(tc, world_path_fn, speed_fn, x0, seconds=3.0):
    """Re-plan every controller step: plan = world_path_fn(now) (world frame, 8 points)."""
    x = np.array(x0, dtype=np.float64)
    ws = None
    lat, spd, applied = [], [], []
    for i in range(int(round(seconds / tc.dt))):
        now = i * tc.dt
        plan, ref_pos_now, ref_speed_now = world_path_fn(now)
        ref = tc.reference(plan, PLAN_DT, np.array([ref_pos_now[0], ref_pos_now[1], x[2]]), frame="world")
        sol = tc.solve(x, ref, warm_start=ws)
        u = sol.controls[0, 0]
        applied.append(u)
        x = sol.states[0, 1]
        ws = shift_controls(sol.controls, 1)
        lat.append((x, now + tc.dt))
        spd.append(x[3])
    return lat, np.array(applied)


def _track_1d(tc, speed_fn, lateral_fn, v0):
    """Track a reference whose world position at time t is (s(t), lateral(t))."""
    t_fine = np.linspace(0.0, 12.0, 12001)
    s_fine = np.concatenate([[0.0], np.cumsum(np.diff(t_fine) * speed_fn(t_fine[1:]))])

    def at(t):
        return np.stack([np.interp(t, t_fine, s_fine), lateral_fn(t)], -1)

    def path(now):
        tk = now + PLAN_DT * np.arange(1, T_PLAN + 1)
        return at(tk), at(np.array([now]))[0], speed_fn(np.array([now]))[0]

    x0 = [0.0, float(lateral_fn(np.array([0.0]))[0]), 0.0, v0, 0.0]
    hist, applied = closed_loop(tc, path, speed_fn, x0)
    lat_err, spd_err = [], []
    for x, t in hist:
        p = at(np.array([t]))[0]
        lat_err.append(abs(x[1] - p[1]))
        spd_err.append(abs(x[3] - speed_fn(np.array([t]))[0]))
    return np.array(lat_err), np.array(spd_err), applied


def test_jacobians_match_finite_differences():
    veh = VehicleParams.from_params(VEHICLE)
    rng = np.random.default_rng(0)
    x = np.column_stack(
        [
            rng.normal(0, 5, 20),
            rng.normal(0, 5, 20),
            rng.uniform(-3, 3, 20),
            rng.uniform(0, 20, 20),
            rng.uniform(-0.5, 0.5, 20),
        ]
    )
    u = np.column_stack([rng.uniform(-4, 2, 20), rng.uniform(-0.5, 0.5, 20)])
    A, B = jacobians(x, u, veh, 0.1)
    eps = 1e-6
    for i in range(5):
        d = np.zeros(5)
        d[i] = eps
        fd = (step(x + d, u, veh, 0.1) - step(x - d, u, veh, 0.1)) / (2 * eps)
        np.testing.assert_allclose(A[:, :, i], fd, atol=1e-7, rtol=1e-6)
    for j in range(2):
        d = np.zeros(2)
        d[j] = eps
        fd = (step(x, u + d, veh, 0.1) - step(x, u - d, veh, 0.1)) / (2 * eps)
        np.testing.assert_allclose(B[:, :, j], fd, atol=1e-7, rtol=1e-6)


def test_constant_steering_drives_a_circle_of_the_model_curvature():
    veh = VehicleParams.from_params(VEHICLE)
    x = np.array([0.0, 0.0, 0.0, 5.0, 0.2])
    pts = [x]
    for _ in range(300):
        x = step(x, np.zeros(2), veh, 0.1)
        pts.append(x)
    pts = np.array(pts)
    beta = np.arctan(veh.rho * np.tan(0.2))
    radius = veh.wheelbase / (np.tan(0.2) * np.cos(beta))
    centre = np.array([-radius * np.sin(beta), radius * np.cos(beta)])
    dist = np.hypot(pts[:, 0] - centre[0], pts[:, 1] - centre[1])
    np.testing.assert_allclose(dist, radius, rtol=2e-3)


def test_tracks_straight(tc):
    lat, spd, _ = _track_1d(tc, lambda t: np.full_like(t, 10.0), lambda t: np.zeros_like(t), 9.0)
    assert lat.max() < 0.3
    assert spd[5:].max() < 0.5


def test_tracks_stop_and_go(tc):
    def speed(t):
        return np.where(t < 1.0, 5.0 - 5.0 * t, np.where(t < 1.8, 0.0, np.minimum(2.0 * (t - 1.8), 4.0)))

    lat, spd, u = _track_1d(tc, speed, lambda t: np.zeros_like(t), 5.0)
    assert lat.max() < 0.3
    assert spd[5:].max() < 0.8
    assert u[:12, 0].min() < -2.0 and u[20:, 0].max() > 1.0  # it brakes, then drives off


def test_tracks_lane_change(tc):
    def lateral(t):
        s = np.clip((t - 0.5) / 3.0, 0.0, 1.0)
        return 3.5 * (10 * s**3 - 15 * s**4 + 6 * s**5)

    lat, spd, _ = _track_1d(tc, lambda t: np.full_like(t, 12.0), lateral, 12.0)
    assert lat.max() < 0.4
    assert spd[5:].max() < 0.5


def test_tracks_curve(tc):
    radius, v = 30.0, 8.0

    def at(t):
        ang = v * t / radius
        return np.stack([radius * np.sin(ang), radius * (1 - np.cos(ang))], -1)

    def path(now):
        return at(now + PLAN_DT * np.arange(1, T_PLAN + 1)), at(np.array([now]))[0], v

    hist, _ = closed_loop(tc, path, None, [0.0, 0.0, 0.0, v, 0.0])
    radial = np.array([abs(np.hypot(x[0], x[1] - radius) - radius) for x, _ in hist])
    speed_err = np.array([abs(x[3] - v) for x, _ in hist])
    assert radial.max() < 0.3
    assert speed_err[5:].max() < 0.5


def test_respects_limits_on_an_infeasible_reference(tc):
    veh = tc.vehicle
    # Ask for a 20 m/s jump and an abrupt 10 m sideways step: inputs must saturate, never exceed.
    plan = np.stack([30.0 * PLAN_DT * np.arange(1, 9), np.full(8, 10.0)], -1)
    ref = tc.reference(plan, PLAN_DT, [0.0, 0.0, 0.0], frame="world")
    sol = tc.solve([0.0, 0.0, 0.0, 5.0, 0.0], ref)
    u, xs = sol.controls[0], sol.states[0]
    assert u[:, 0].max() <= veh.max_accel + 1e-9 and u[:, 0].min() >= veh.min_accel - 1e-9
    assert np.abs(u[:, 1]).max() <= veh.max_steer_rate + 1e-9
    assert np.abs(xs[:, 4]).max() <= veh.max_steer + 1e-9
    assert xs[:, 3].min() >= -1e-9 and xs[:, 3].max() <= veh.max_speed + 1e-9
    assert np.isclose(u[:, 0].max(), veh.max_accel)  # it does push at the limit
    # Braking to a stop never reverses.
    stop = tc.reference(np.zeros((8, 2)), PLAN_DT, [0.0, 0.0, 0.0], frame="ego")
    sol = tc.solve([0.0, 0.0, 0.0, 10.0, 0.0], stop)
    assert sol.states[0, :, 3].min() >= 0.0
    assert sol.controls[0, :, 0].min() >= veh.min_accel - 1e-9
    assert sol.states[0, -1, 3] < 0.5


def test_solution_is_a_consistent_rollout_and_improves_the_guess(tc):
    plan = np.stack([8.0 * PLAN_DT * np.arange(1, 9), 0.2 * np.arange(1, 9)], -1)
    ref = tc.reference(plan, PLAN_DT, [0, 0, 0])
    sol = tc.solve([0.0, 1.0, 0.1, 6.0, 0.0], ref)
    xs, applied = tc.rollout([0.0, 1.0, 0.1, 6.0, 0.0], sol.controls)
    np.testing.assert_allclose(xs, sol.states, atol=1e-9)
    np.testing.assert_allclose(tc.cost(sol.states, sol.controls, ref), sol.report.final_cost, rtol=1e-9)
    assert sol.report.converged[0]
    assert sol.report.final_cost[0] < 0.2 * sol.report.initial_cost[0]
    assert 0 < sol.report.iterations[0] <= tc.settings.max_iterations


def test_batched_equals_individual(tc):
    rng = np.random.default_rng(3)
    plans, states = [], []
    for _ in range(6):
        v = rng.uniform(3, 12)
        t = PLAN_DT * np.arange(1, 9)
        plans.append(np.stack([v * t, rng.normal(0, 0.5) * t**2 / 4], -1))
        states.append([0.0, rng.normal(0, 0.5), rng.normal(0, 0.05), v + rng.normal(0, 1), 0.0])
    plans, states = np.array(plans), np.array(states)
    ref = tc.reference(plans, PLAN_DT, np.zeros((6, 3)))
    batch = tc.solve(states, ref)
    for i in range(6):
        single = tc.solve(states[i], ref.states[i])
        np.testing.assert_allclose(batch.controls[i], single.controls[0], atol=1e-8)
        np.testing.assert_allclose(batch.states[i], single.states[0], atol=1e-8)
        assert batch.report.iterations[i] == single.report.iterations[0]


@pytest.mark.parametrize(
    "plan",
    [
        np.array([[5.0, 0.0]]),  # single point
        np.zeros((8, 2)),  # all equal at the ego: stopped
        np.full((8, 2), 3.0),  # all equal ahead
        np.stack([np.r_[0, 1, 2, 2, 2, 2, 2, 2.0], np.zeros(8)], -1),  # stops mid-plan
        np.stack([np.r_[2, 1, 0, -1, -2, -3, -4, -5.0], np.zeros(8)], -1),  # reversing
    ],
)
def test_degenerate_references_yield_sane_controls(tc, plan):
    ref = tc.reference(plan, PLAN_DT, [0.0, 0.0, 0.3])
    assert np.isfinite(ref.states).all()
    assert (ref.states[0, :, 3] >= 0.0).all()
    sol = tc.solve([0.0, 0.0, 0.3, 2.0, 0.0], ref)
    assert np.isfinite(sol.controls).all() and np.isfinite(sol.states).all()
    assert sol.states[0, :, 3].min() >= 0.0
    assert np.abs(sol.states[0, :, 4]).max() <= tc.vehicle.max_steer + 1e-9


def test_reference_headings_and_speeds():
    veh = VehicleParams.from_params(VEHICLE)
    # Stop mid-plan: heading keeps the last valid value, speed reaches ~0, no backward motion.
    plan = np.stack([np.r_[1, 2, 3, 3, 3, 3, 3, 3.0], np.r_[1, 2, 3, 3, 3, 3, 3, 3.0]], -1)
    ref = build_reference(plan, PLAN_DT, [0.0, 0.0, 0.0], veh, 0.1, 40,
                          min_heading_speed=MIN_SPEED).states[0]
    assert np.allclose(ref[-10:, 2], np.pi / 4, atol=1e-6)
    assert ref[-10:, 3].max() < 1e-6
    along = np.diff(ref[:, 0]) + np.diff(ref[:, 1])
    assert along.min() >= -1e-9
    # Heading continuity near +-pi: driving along -x with the ego yaw at -pi.
    plan = np.stack([-5.0 * PLAN_DT * np.arange(1, 9), np.zeros(8)], -1)
    ref = build_reference(plan, PLAN_DT, [0.0, 0.0, -np.pi], veh, 0.1, 40,
                          min_heading_speed=MIN_SPEED).states[0]
    np.testing.assert_allclose(ref[:, 2], -np.pi, atol=1e-6)
    np.testing.assert_allclose(ref[:, 3], 5.0, atol=1e-6)
    # Ego-frame plan converted with the ego pose.
    pose = np.array([10.0, -2.0, np.pi / 2])
    plan = np.stack([4.0 * PLAN_DT * np.arange(1, 9), np.zeros(8)], -1)
    ref = build_reference(plan, PLAN_DT, pose, veh, 0.1, 40, frame="ego",
                          min_heading_speed=MIN_SPEED).states[0]
    np.testing.assert_allclose(ref[9, :2], [10.0, -2.0 + 4.0], atol=1e-9)
    np.testing.assert_allclose(ref[:, 2], np.pi / 2, atol=1e-9)


def test_bad_inputs_raise_errors_naming_the_field(tc):
    plan = np.stack([np.arange(1, 9.0), np.zeros(8)], -1)
    plan[3, 1] = np.nan
    with pytest.raises(ReferenceError, match=r"points\[0, 3, 1\]"):
        tc.reference(plan, PLAN_DT, [0, 0, 0])
    with pytest.raises(ReferenceError, match="points"):
        tc.reference(np.zeros((0, 2)), PLAN_DT, [0, 0, 0])
    with pytest.raises(ReferenceError, match="plan_dt"):
        tc.reference(np.ones((8, 2)), -1.0, [0, 0, 0])
    with pytest.raises(ReferenceError, match=r"states\[0, 3\]"):
        tc.solve([0, 0, 0, np.inf, 0], np.zeros((1, tc.horizon, 5)))


def test_clamp_keeps_states_feasible():
    veh = VehicleParams.from_params(VEHICLE)
    x = np.array([[0, 0, 0, 0.1, 0.59], [0, 0, 0, 34.9, -0.59]])
    u = clamp_controls(x, np.array([[-9.0, 5.0], [9.0, -5.0]]), veh, 0.1)
    nxt = step(x, u, veh, 0.1)
    assert nxt[0, 3] >= 0.0 and nxt[0, 4] <= veh.max_steer + 1e-12
    assert nxt[1, 3] <= veh.max_speed + 1e-12 and nxt[1, 4] >= -veh.max_steer - 1e-12


def test_stop_controls_brake_comfortably(tc):
    u = tc.stop_controls([[0, 0, 0, 10.0, 0.1]], 2.5)
    assert np.allclose(u[0, :, 1], 0.0)
    assert u[0, :, 0].min() >= -2.5 - 1e-9
    xs, _ = tc.rollout([[0, 0, 0, 10.0, 0.1]], u)
    assert xs[0, -1, 3] == pytest.approx(0.0, abs=1e-9)


def test_command_jerk_limit_bounds_every_change_of_acceleration():
    """limit_jerk: from the last command and from input to input the acceleration moves by at most
    max_jerk_up * dt (rising) and max_jerk_down * dt (falling); steering inputs are untouched; in-bounds
    sequences come back unchanged; an emergency stop (the first 0.5 s averaging braking beyond
    emergency_decel) and the way back from such braking are not limited."""
    import copy

    cfg = copy.deepcopy(load_params("controller"))
    cfg["controller"]["command"].update(max_jerk_up=4.0, max_jerk_down=8.0, emergency_decel=3.0,
                                        emergency_window_s=0.5)
    tc = TrackingController(cfg, VEHICLE)
    u = np.zeros((5, 6, 2))
    u[0, :, 0] = 3.0  # a throttle step
    u[1, :, 0] = -2.0  # a brake step within the comfortable range
    u[2, :, 0] = -6.0  # an emergency stop
    u[3, :, 0] = 0.5  # released after braking at 5 m/s^2
    u[4, :, 0] = [0.05, 0.1, 0.15, 0.2, 0.25, 0.3]  # a gentle ramp: within both limits
    u[:, :, 1] = 0.3
    out = tc.limit_jerk(u, prev_accel=[0.0, 0.0, 1.0, -5.0, 0.0])
    assert np.allclose(out[0, :, 0], [0.4, 0.8, 1.2, 1.6, 2.0, 2.4])
    assert np.allclose(out[1, :, 0], [-0.8, -1.6, -2.0, -2.0, -2.0, -2.0])
    assert np.array_equal(out[2:], u[2:]) and np.array_equal(out[:, :, 1], u[:, :, 1])
    steps = np.diff(np.concatenate([np.zeros((2, 1)), out[:2, :, 0]], axis=1), axis=1)
    assert steps.max() <= 0.4 + 1e-12 and steps.min() >= -0.8 - 1e-12
    slow = tc.limit_jerk(u[0], prev_accel=0.0, elapsed_s=0.05)  # the node: 50 ms since the last command
    assert slow[0, 0] == pytest.approx(0.2) and slow[1, 0] == pytest.approx(0.6)
    # a measured acceleration the vehicle cannot produce (a logged finite difference of 12 m/s^2) is not
    # ramped from: the first input is the solve's own; the next ones are limited from it
    spiky = tc.limit_jerk(u[4], prev_accel=12.0)
    assert np.allclose(spiky[:, 0], u[4, :, 0])
    assert tc.limit_jerk(u[0], prev_accel=VEHICLE["vehicle"]["max_accel"])[0, 0] == pytest.approx(3.0)
    assert tc.limit_jerk(np.zeros((2, 0, 2)), prev_accel=[12.0, 0.0]).shape == (2, 0, 2)  # empty horizon
    cfg["controller"]["command"].update(max_jerk_up=0.0, max_jerk_down=0.0)  # off
    assert np.array_equal(TrackingController(cfg, VEHICLE).limit_jerk(u, np.zeros(5)), u)
    for bad in (-1.0, float("nan"), "4", True):
        cfg["controller"]["command"]["max_jerk_up"] = bad
        with pytest.raises(Exception, match="controller.command.max_jerk_up"):
            TrackingController(cfg, VEHICLE)


def _stop_and_go_plan(v, plan_dt=PLAN_DT, points=T_PLAN):
    """Brake from v to a standstill over 1.5 s, wait 1 s, drive off at 2 m/s² (ego frame)."""
    t = plan_dt * np.arange(1, points + 1)
    speed = np.where(t < 1.5, v * (1.0 - t / 1.5), np.where(t < 2.5, 0.0, 2.0 * (t - 2.5)))
    return np.stack([np.cumsum(speed * plan_dt), np.zeros_like(t)], -1)


def _mixed_problems(tc, n=16, seed=7):
    """Straight, curve, stop-and-go and lane-change references with offsets, plus limit cases."""
    rng = np.random.default_rng(seed)
    t = PLAN_DT * np.arange(1, T_PLAN + 1)
    plans, states = [], []
    for i in range(n):
        v = rng.uniform(3.0, 14.0)
        kind = i % 4
        if kind == 0:
            plan = np.stack([v * t, np.zeros_like(t)], -1)
        elif kind == 1:
            radius = rng.uniform(15.0, 50.0) * rng.choice([-1.0, 1.0])
            plan = np.stack([radius * np.sin(v * t / radius), radius * (1 - np.cos(v * t / radius))], -1)
        elif kind == 2:
            v = rng.uniform(2.0, 6.0)
            plan = _stop_and_go_plan(v)
        else:
            s = np.clip(t / 3.0, 0.0, 1.0)
            plan = np.stack([v * t, 3.5 * (10 * s**3 - 15 * s**4 + 6 * s**5)], -1)
        plans.append(plan)
        states.append([0.0, rng.normal(0, 0.4), rng.normal(0, 0.05), max(0.0, v + rng.normal(0, 1.0)), 0.0])
    # Limits: an infeasible jump, a hard stop, standing still at a stop.
    plans.append(np.stack([30.0 * t, np.full(T_PLAN, 10.0)], -1))
    states.append([0.0, 0.0, 0.0, 5.0, 0.0])
    plans.append(np.zeros((T_PLAN, 2)))
    states.append([0.0, 0.0, 0.0, 10.0, 0.0])
    plans.append(np.zeros((T_PLAN, 2)))
    states.append([0.0, 0.2, 0.0, 0.0, 0.3])
    plans, states = np.array(plans), np.array(states)
    return states, tc.reference(plans, PLAN_DT, np.zeros((len(plans), 3)))


@pytest.mark.parametrize("max_iterations", [None, 2])
def test_small_batch_kernel_equals_batched_kernel(tc, max_iterations):
    """The float kernel (small batches) and the numpy kernel run the same iteration to the same iterates."""
    states, ref = _mixed_problems(tc)
    a = tc.solve(states, ref, max_iterations=max_iterations, kernel="numpy")
    b = tc.solve(states, ref, max_iterations=max_iterations, kernel="small")
    np.testing.assert_allclose(b.controls, a.controls, atol=1e-9)
    np.testing.assert_allclose(b.states, a.states, atol=1e-9)
    np.testing.assert_allclose(b.report.final_cost, a.report.final_cost, rtol=1e-10)
    np.testing.assert_allclose(b.report.initial_cost, a.report.initial_cost, rtol=1e-12)
    np.testing.assert_array_equal(b.report.iterations, a.report.iterations)
    np.testing.assert_array_equal(b.report.converged, a.report.converged)
    np.testing.assert_allclose(b.report.regularization, a.report.regularization, rtol=1e-12)
    if max_iterations is None:  # all but the infeasible jump (index -3) converge within the cap
        assert a.report.converged[:-3].all() and a.report.converged[-2:].all()
    # Warm start from the shifted solution, one step later, through the default (auto) kernel choice.
    ws = shift_controls(a.controls, 1)
    for kernel in ("numpy", "small"):
        w = tc.solve(a.states[:, 1], ref.states, warm_start=ws, kernel=kernel)
        if kernel == "numpy":
            w_numpy = w
    np.testing.assert_allclose(w.controls, w_numpy.controls, atol=1e-9)
    np.testing.assert_array_equal(w.report.iterations, w_numpy.report.iterations)
    single = tc.solve(states[2], ref.states[2])  # a single problem takes the small kernel
    assert single.report.extra["kernel"] == "small"
    np.testing.assert_allclose(single.controls[0], a.controls[2], atol=1e-9)
    assert tc.solve(states, ref).report.extra["kernel"] == "numpy"  # 19 problems: batched
    with pytest.raises(ValueError, match="kernel"):
        tc.solve(states, ref, kernel="fast")


def test_line_search_does_not_stall_at_a_stop(tc):
    """Braking to a standstill: a held acceleration stays on the no-reversing limit in the model, so
    every step the local model predicts is attainable (no rejected steps, quick convergence)."""
    for v, dy in ((3.0, 0.3), (4.5, -0.2), (5.5, 0.1)):
        ref = tc.reference(_stop_and_go_plan(v, 0.5, 8), 0.5, [0.0, 0.0, 0.0])
        for kernel in ("numpy", "small"):
            sol = tc.solve([0.0, dy, 0.0, v + 0.3, 0.0], ref, kernel=kernel)
            rep = sol.report
            assert rep.converged[0]
            assert rep.iterations[0] <= 8
            # mu only grows after a rejected step; it starts at reg_init and shrinks on acceptance.
            assert rep.regularization[0] <= tc.settings.reg_init
            assert sol.states[0, :, 3].min() >= 0.0
