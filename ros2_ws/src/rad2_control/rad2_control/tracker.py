"""``TrackingController``: the one entry point the simulator, the controller node and the benchmark use.

It takes ``params/controller.yaml`` and ``params/vehicle.yaml`` as its caller loaded them, turns plans
into references (``reference.py``) and solves the batched iLQR problem (``ilqr.py``).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
from rad2_core.bicycle import IA, IRATE, ISTEER, IV, NX, VehicleParams, clamp_controls, rollout

from rad2_control.ilqr import (
    ControllerParamsError,
    CostWeights,
    ILQRSettings,
    SolveReport,
    _num,
    ilqr_solve,
    tracking_cost,
)
from rad2_control.reference import Reference, ReferenceError, build_reference


class TrackingSolution(NamedTuple):
    controls: np.ndarray  # [B, H, 2] (accel, steer_rate), applied (within limits)
    states: np.ndarray  # [B, H+1, 5] predicted states, states[:, 0] = the given states
    report: SolveReport


class TrackingController:
    """iLQR tracker of planned trajectories on the kinematic bicycle.

    ``controller_params`` / ``vehicle_params``: params/controller.yaml and params/vehicle.yaml as the
    caller loaded them (the files, or their ``controller`` / ``vehicle`` blocks; the schemas bound
    the values).
    """

    def __init__(self, controller_params: dict[str, Any], vehicle_params: dict[str, Any]):
        block = controller_params.get("controller", controller_params)
        self.vehicle = VehicleParams.from_params(vehicle_params)
        self.dt = _num(block, "dt", "controller")
        self.horizon = int(_num(block, "horizon", "controller"))
        self.weights = CostWeights.from_params(block)
        self.settings = ILQRSettings.from_params(block)
        if "reference" not in block:
            raise ControllerParamsError("missing parameter controller.reference")
        self.min_heading_speed = _num(block["reference"], "min_heading_speed", "controller.reference")
        if "command" not in block:
            raise ControllerParamsError("missing parameter controller.command")
        limits = []
        for name in ("max_jerk_up", "max_jerk_down"):
            value = block["command"].get(name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not np.isfinite(value) \
                    or value < 0.0:
                raise ControllerParamsError(f"controller.command.{name} must be a number >= 0 (0: off), "
                                            f"got {value!r}")
            limits.append(float(value))
        self.max_jerk_up, self.max_jerk_down = limits
        self.emergency_decel = _num(block["command"], "emergency_decel", "controller.command")
        self.emergency_window = max(1, int(round(_num(block["command"], "emergency_window_s",
                                                      "controller.command") / self.dt)))

    # -- references -------------------------------------------------------------------------------
    def reference(self, plan, plan_dt: float, start_pose, age=0.0, frame: str = "ego") -> Reference:
        """Reference for plan(s) ``[T, 2]``/``[B, T, 2]`` made at ``start_pose`` ``age`` seconds ago."""
        return build_reference(
            plan,
            plan_dt,
            start_pose,
            self.vehicle,
            self.dt,
            self.horizon,
            age=age,
            min_heading_speed=self.min_heading_speed,
            frame=frame,
        )

    def _check_states(self, states) -> np.ndarray:
        x = np.asarray(states, dtype=np.float64)
        if x.ndim == 1:
            x = x[None]
        if x.ndim != 2 or x.shape[1] != NX:
            raise ReferenceError(f"states: expected shape [B, {NX}], got {tuple(np.shape(states))}")
        bad = ~np.isfinite(x)
        if bad.any():
            i, j = (int(v) for v in np.argwhere(bad)[0])
            raise ReferenceError(f"states[{i}, {j}] is not finite ({x[i, j]!r})")
        # Bring the state inside the model's bounds (odometry may report tiny negative speeds).
        x = x.copy()
        x[:, IV] = np.clip(x[:, IV], 0.0, self.vehicle.max_speed)
        x[:, ISTEER] = np.clip(x[:, ISTEER], -self.vehicle.max_steer, self.vehicle.max_steer)
        return x

    def initial_guess(self, states: np.ndarray, ref: np.ndarray) -> np.ndarray:
        """Feed-forward inputs that follow the reference speed and steering from the current state."""
        prev = np.concatenate([states[:, None, IV:], ref[:, :-1, IV:]], axis=1)
        u = (ref[:, :, IV:] - prev) / self.dt
        lo, hi = self.vehicle.control_bounds()
        return np.clip(u, lo, hi)

    # -- solve ------------------------------------------------------------------------------------
    def solve(
        self,
        states,
        references,
        warm_start=None,
        max_iterations: int | None = None,
        kernel: str = "auto",
    ) -> TrackingSolution:
        """Track ``references`` (``Reference`` or ``[B, H, 5]``) from ``states`` ``[B, 5]``.

        ``warm_start``: ``[B, H, 2]`` initial inputs (e.g. ``shift_controls`` of the previous
        solution); otherwise a feed-forward guess from the reference. ``kernel``: see
        ``ilqr.ilqr_solve`` (the default picks the faster one; results are the same).
        """
        x0 = self._check_states(states)
        ref = (
            references.states
            if isinstance(references, Reference)
            else np.asarray(references, dtype=np.float64)
        )
        if ref.ndim == 2:
            ref = ref[None]
        if ref.shape != (x0.shape[0], self.horizon, NX):
            raise ReferenceError(
                f"references: expected shape [{x0.shape[0]}, {self.horizon}, {NX}], got {tuple(ref.shape)}"
            )
        if not np.isfinite(ref).all():
            i = tuple(int(v) for v in np.argwhere(~np.isfinite(ref))[0])
            raise ReferenceError(f"references{list(i)} is not finite ({ref[i]!r})")
        if warm_start is None:
            u0 = self.initial_guess(x0, ref)
            cap = self.settings.max_iterations
        else:
            u0 = np.asarray(warm_start, dtype=np.float64)
            if u0.ndim == 2:
                u0 = u0[None]
            if u0.shape != (x0.shape[0], self.horizon, 2):
                raise ReferenceError(
                    f"warm_start: expected shape [{x0.shape[0]}, {self.horizon}, 2], got {tuple(u0.shape)}"
                )
            if not np.isfinite(u0).all():
                u0 = self.initial_guess(x0, ref)
            cap = self.settings.max_iterations_warm
        if max_iterations is not None:
            cap = int(max_iterations)
        controls, xs, report = ilqr_solve(
            x0, ref, u0, self.vehicle, self.dt, self.weights, self.settings, cap, kernel=kernel
        )
        return TrackingSolution(controls, xs, report)

    def cost(self, states, controls, references) -> np.ndarray:
        """Eq. 10 cost of given predicted states [B, H+1, 5] and controls [B, H, 2]."""
        ref = references.states if isinstance(references, Reference) else np.asarray(references)
        return tracking_cost(np.asarray(states), np.asarray(controls), ref, self.weights)

    def rollout(self, states, controls) -> tuple[np.ndarray, np.ndarray]:
        """Open-loop rollout with input projection: (states [B, H+1, 5], applied controls)."""
        return rollout(self._check_states(states), controls, self.vehicle, self.dt)

    def stop_controls(self, states, decel: float) -> np.ndarray:
        """Minimal-risk stop: brake at ``decel`` (m/s², > 0) until standstill, steering angle held.

        Returns ``[B, H, 2]`` inputs (already projected onto the limits).
        """
        if not np.isfinite(decel) or decel <= 0.0:
            raise ControllerParamsError(f"stop deceleration must be positive, got {decel!r}")
        x = self._check_states(states)
        u = np.zeros((x.shape[0], self.horizon, 2))
        u[..., IA] = -min(decel, -self.vehicle.min_accel)
        u[..., IRATE] = 0.0
        _, applied = rollout(x, u, self.vehicle, self.dt)
        return applied

    def limit_jerk(self, controls, prev_accel, elapsed_s: float | None = None) -> np.ndarray:
        """``controls`` ``[B, H, 2]`` (or ``[H, 2]``) with the acceleration made to change by at most
        ``max_jerk_up`` (rising) / ``max_jerk_down`` (falling) m/s^3 from ``prev_accel`` (``[B]`` or a
        number: the acceleration applied last) and from input to input; 0 leaves that direction free.

        Why: every cycle's iLQR solve starts from a new plan and does not see the previous command, so
        its first input can step by several m/s^2 from one 0.1 s command to the next, a jerk the
        passengers feel (and beyond nuPlan's 4.13 m/s^3). Like the jerk limits of Autoware's
        vehicle_cmd_gate, the command is rate limited after the solve; the next cycle's solve starts from
        the state the limited command produced, so the plan is still tracked, only not in one jump.
        Braking may be allowed to build up faster (``max_jerk_down``) than the throttle. A solve whose
        first ``emergency_window_s`` average a deceleration beyond ``emergency_decel`` (a plan that stops
        for an obstacle: the safety envelope, a red light) brakes without the limit: comfort never
        delays an emergency stop, and the way back from braking beyond ``emergency_decel`` is not
        limited either. (Why both: the safety envelope may brake for one cycle and release in the next;
        a limited way back from such a brake, or an unlimited fall at every step, lets the falls through
        and holds the rises, which drifts the ego slower than its plans and into logged followers: on
        the real validation clips, collisions rose from 0.05 to 0.28.)
        ``elapsed_s``: time from the last command to the first input (default: the step ``dt``; the
        controller node commands faster than it steps the model). A ``prev_accel`` beyond the vehicle's
        acceleration limits (a measured value, never a command) leaves the first input unlimited."""
        u = np.array(controls, dtype=np.float64)
        single = u.ndim == 2
        if single:
            u = u[None]
        if self.max_jerk_up <= 0.0 and self.max_jerk_down <= 0.0:
            return u[0] if single else u
        a = np.broadcast_to(np.asarray(prev_accel, dtype=np.float64), (u.shape[0],)).copy()
        if not np.isfinite(a).all():
            raise ReferenceError(f"prev_accel: not finite ({np.asarray(prev_accel)!r})")
        # an acceleration the vehicle cannot produce is a measurement error (a logged track's finite
        # difference, an IMU spike), not a state to ramp from: the first input is not limited then
        lo, hi = self.vehicle.min_accel, self.vehicle.max_accel
        implausible = (a > hi + 1e-6) | (a < lo - 1e-6)
        if u.shape[1] > 0:
            a = np.where(implausible, u[:, 0, IA], a)
        first = self.dt if elapsed_s is None else float(elapsed_s)
        if not np.isfinite(first) or first < 0.0:
            raise ReferenceError(f"elapsed_s: must be a finite time >= 0, got {elapsed_s!r}")
        emergency = u[:, : self.emergency_window, IA].mean(axis=1) < -self.emergency_decel
        for k in range(u.shape[1]):
            step = first if k == 0 else self.dt
            # into an emergency stop, and back from a command braking beyond emergency_decel, unlimited
            free = emergency | (a < -self.emergency_decel)
            up = np.where(free, np.inf, self.max_jerk_up * step if self.max_jerk_up > 0.0 else np.inf)
            down = np.where(free, np.inf, self.max_jerk_down * step if self.max_jerk_down > 0.0 else np.inf)
            a = np.clip(u[:, k, IA], a - down, a + up)
            u[:, k, IA] = a
        return u[0] if single else u

    def project(self, states, controls) -> np.ndarray:
        return clamp_controls(states, controls, self.vehicle, self.dt)
