"""Kinematic bicycle model referenced at the box centre, discretised with explicit midpoint (RK2).

State ``x = (x, y, yaw, v, delta)`` (world frame, box centre, rad, m/s, front-wheel angle in rad);
input ``u = (a, delta_dot)`` (m/s², rad/s). Continuous dynamics, with ``L`` the wheelbase and ``l_r``
the distance from the rear axle to the box centre (``rho = l_r / L``)::

    beta(delta)  = atan(rho * tan(delta))                  # slip angle of the centre
    kappa(delta) = tan(delta) * cos(beta) / L              # path curvature of the centre
    x' = v cos(yaw + beta),  y' = v sin(yaw + beta),  yaw' = v kappa(delta),  v' = a,  delta' = delta_dot

One step of length ``dt`` uses the explicit midpoint rule with the input held constant. Because ``v``
and ``delta`` are linear in time over a step, their update is exact; the midpoint only approximates
the position and heading. All functions broadcast over any number of leading axes (batches,
line-search candidates, time) and the Jacobians are analytic (tests compare them to finite
differences).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

NX = 5
NU = 2
IX, IY, IYAW, IV, ISTEER = range(NX)
IA, IRATE = range(NU)


class VehicleParamsError(ValueError):
    """A vehicle parameter is missing or out of its valid range."""


@dataclass(frozen=True)
class VehicleParams:
    """Geometry and actuation limits of the ego (values come from ``params/vehicle.yaml``)."""

    length: float
    width: float
    wheelbase: float
    rear_axle_to_center: float
    max_accel: float
    min_accel: float
    max_steer: float
    max_steer_rate: float
    max_speed: float

    def __post_init__(self) -> None:
        # the schema bounds each value alone (params/vehicle.schema.yaml); it cannot relate two of them
        if not 0.0 <= self.rear_axle_to_center <= self.wheelbase:
            raise VehicleParamsError(
                f"vehicle.rear_axle_to_center must lie in [0, wheelbase={self.wheelbase}], "
                f"got {self.rear_axle_to_center!r}"
            )

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> VehicleParams:
        """Build from params/vehicle.yaml as loaded (the ``vehicle`` block or the whole file)."""
        block = params.get("vehicle", params)
        missing = [name for name in cls.__dataclass_fields__ if name not in block]
        if missing:
            raise VehicleParamsError(f"missing parameter vehicle.{missing[0]}")
        return cls(**{name: float(block[name]) for name in cls.__dataclass_fields__})

    @property
    def rho(self) -> float:
        return self.rear_axle_to_center / self.wheelbase

    def control_bounds(self) -> tuple[np.ndarray, np.ndarray]:
        """Constant input box: (lower, upper) for (a, delta_dot)."""
        lo = np.array([self.min_accel, -self.max_steer_rate])
        hi = np.array([self.max_accel, self.max_steer_rate])
        return lo, hi

    def state_bounds(self) -> tuple[np.ndarray, np.ndarray]:
        """Bounds of (v, delta): no reversing, speed cap, steering-angle limit."""
        return np.array([0.0, -self.max_steer]), np.array([self.max_speed, self.max_steer])


def slip_and_curvature(delta, vehicle: VehicleParams, derivatives: bool = False):
    """beta(delta), kappa(delta) and, if asked, their derivatives with respect to delta."""
    t = np.tan(delta)
    rho = vehicle.rho
    q = 1.0 + (rho * t) ** 2
    inv_sqrt_q = 1.0 / np.sqrt(q)
    beta = np.arctan(rho * t)
    kappa = t * inv_sqrt_q / vehicle.wheelbase
    if not derivatives:
        return beta, kappa
    sec2 = 1.0 + t * t
    dbeta = rho * sec2 / q
    dkappa = sec2 * inv_sqrt_q / q / vehicle.wheelbase
    return beta, kappa, dbeta, dkappa


def steer_for_curvature(kappa, vehicle: VehicleParams):
    """Front-wheel angle whose centre-path curvature is ``kappa`` (clipped to the steering limit)."""
    kappa = np.asarray(kappa, dtype=np.float64)
    kmax = slip_and_curvature(vehicle.max_steer, vehicle)[1]
    k = np.clip(kappa, -kmax, kmax) * vehicle.wheelbase
    t = k / np.sqrt(np.maximum(1.0 - (vehicle.rho * k) ** 2, 1e-9))
    return np.arctan(t)


def step(state, control, vehicle: VehicleParams, dt: float) -> np.ndarray:
    """One midpoint (RK2) step. ``state`` (..., 5), ``control`` (..., 2) -> next state (..., 5).

    The input is applied as given (no clamping; see ``clamp_controls``).
    """
    state = np.asarray(state, dtype=np.float64)
    control = np.asarray(control, dtype=np.float64)
    v, delta = state[..., IV], state[..., ISTEER]
    a, rate = control[..., IA], control[..., IRATE]
    half = 0.5 * dt
    vm = v + half * a
    dm = delta + half * rate
    _, kappa0 = slip_and_curvature(delta, vehicle)
    beta_m, kappa_m = slip_and_curvature(dm, vehicle)
    yaw_m = state[..., IYAW] + half * v * kappa0
    th = yaw_m + beta_m
    dist = dt * vm
    return np.stack(
        [
            state[..., IX] + dist * np.cos(th),
            state[..., IY] + dist * np.sin(th),
            state[..., IYAW] + dist * kappa_m,
            v + dt * a,
            delta + dt * rate,
        ],
        axis=-1,
    )


def clamp_controls(state, control, vehicle: VehicleParams, dt: float) -> np.ndarray:
    """Project inputs onto the feasible set of the current state.

    Acceleration and steering rate are clipped to their boxes, then further so that the next speed
    stays in [0, max_speed] (no reversing) and the next steering angle within +-max_steer. Because
    v and delta are exact linear updates, the clamped input keeps every later state inside bounds.
    """
    state = np.asarray(state, dtype=np.float64)
    lo, hi = vehicle.control_bounds()
    slo, shi = vehicle.state_bounds()
    u = np.clip(control, lo, hi)
    vd = state[..., IV : ISTEER + 1]
    nxt = np.clip(vd + dt * u, slo, shi)
    return (nxt - vd) / dt


def rollout(x0, controls, vehicle: VehicleParams, dt: float, clamp: bool = True):
    """Open-loop rollout: x0 (..., 5), controls (..., T, 2) -> (states (..., T+1, 5), applied inputs)."""
    x0 = np.asarray(x0, dtype=np.float64)
    controls = np.asarray(controls, dtype=np.float64)
    horizon = controls.shape[-2]
    states = np.empty(controls.shape[:-2] + (horizon + 1, NX))
    applied = np.empty_like(controls)
    states[..., 0, :] = x0
    x = x0
    for k in range(horizon):
        u = controls[..., k, :]
        if clamp:
            u = clamp_controls(x, u, vehicle, dt)
        applied[..., k, :] = u
        x = step(x, u, vehicle, dt)
        states[..., k + 1, :] = x
    return states, applied



def propagate(x0, controls, durations, vehicle: VehicleParams, max_step: float) -> np.ndarray:
    """State after piecewise-constant inputs held for given (possibly uneven) durations.

    ``x0`` (5,), ``controls`` (N, 2), ``durations`` (N,) seconds (>= 0). Each segment is integrated
    with ``step`` in equal sub-steps no longer than ``max_step`` and inputs projected with
    ``clamp_controls`` (no reversing, steering within limits). Used to predict the state from a
    measurement's stamp to the time a command applies.
    """
    x = np.asarray(x0, dtype=np.float64)
    controls = np.asarray(controls, dtype=np.float64).reshape(-1, NU)
    durations = np.asarray(durations, dtype=np.float64).reshape(-1)
    if controls.shape[0] != durations.shape[0]:
        raise ValueError(f"controls: {controls.shape[0]} segments, durations: {durations.shape[0]}")
    if not max_step > 0.0:
        raise ValueError(f"max_step must be positive, got {max_step!r}")
    for u, dur in zip(controls, durations):
        if not dur > 0.0:
            continue
        n = int(np.ceil(dur / max_step - 1e-9))
        h = dur / n
        for _ in range(n):
            x = step(x, clamp_controls(x, u, vehicle, h), vehicle, h)
    return x

# Entries of the step Jacobians that are neither 0 nor 1 (A = I + these; B also has B[IV, IA] =
# B[ISTEER, IRATE] = dt), in the order ``jacobian_entries`` returns them.
JAC_A_INDEX = (
    (IX, IYAW),
    (IY, IYAW),
    (IX, IV),
    (IY, IV),
    (IYAW, IV),
    (IX, ISTEER),
    (IY, ISTEER),
    (IYAW, ISTEER),
)
JAC_B_INDEX = ((IX, IA), (IY, IA), (IYAW, IA), (IX, IRATE), (IY, IRATE), (IYAW, IRATE))


def jacobian_entries(state, control, vehicle: VehicleParams, dt: float) -> np.ndarray:
    """The non-trivial entries of ``jacobians`` (..., 14): A at ``JAC_A_INDEX``, then B at ``JAC_B_INDEX``."""
    state = np.asarray(state, dtype=np.float64)
    control = np.asarray(control, dtype=np.float64)
    v, delta = state[..., IV], state[..., ISTEER]
    half = 0.5 * dt
    vm = v + half * control[..., IA]
    dm = delta + half * control[..., IRATE]
    _, kappa0, _, dkappa0 = slip_and_curvature(delta, vehicle, derivatives=True)
    beta_m, kappa_m, dbeta_m, dkappa_m = slip_and_curvature(dm, vehicle, derivatives=True)
    th = state[..., IYAW] + half * v * kappa0 + beta_m
    dist = dt * vm
    dc, ds = dist * np.cos(th), dist * np.sin(th)
    # d th / d(v, delta, rate); d th / d a = 0 and d dist / d a = dt * half.
    th_v = half * kappa0
    th_d = half * v * dkappa0 + dbeta_m
    th_r = half * dbeta_m
    c_over = np.cos(th) * dt
    s_over = np.sin(th) * dt
    out = np.empty(state.shape[:-1] + (14,))
    out[..., 0] = -ds
    out[..., 1] = dc
    out[..., 2] = c_over - ds * th_v
    out[..., 3] = s_over + dc * th_v
    out[..., 4] = dt * kappa_m
    out[..., 5] = -ds * th_d
    out[..., 6] = dc * th_d
    out[..., 7] = dist * dkappa_m
    out[..., 8] = half * c_over
    out[..., 9] = half * s_over
    out[..., 10] = dt * half * kappa_m
    out[..., 11] = -ds * th_r
    out[..., 12] = dc * th_r
    out[..., 13] = half * dist * dkappa_m
    return out


_A_ROWS, _A_COLS = (np.array(ix) for ix in zip(*JAC_A_INDEX))
_B_ROWS, _B_COLS = (np.array(ix) for ix in zip(*JAC_B_INDEX))


def jacobians(state, control, vehicle: VehicleParams, dt: float) -> tuple[np.ndarray, np.ndarray]:
    """Analytic Jacobians of ``step``: A = d x_next / d x (..., 5, 5), B = d x_next / d u (..., 5, 2)."""
    e = jacobian_entries(state, control, vehicle, dt)
    shape = e.shape[:-1]
    A = np.zeros(shape + (NX, NX))
    B = np.zeros(shape + (NX, NU))
    A[..., np.arange(NX), np.arange(NX)] = 1.0
    A[..., _A_ROWS, _A_COLS] = e[..., :8]
    B[..., _B_ROWS, _B_COLS] = e[..., 8:]
    B[..., IV, IA] = dt
    B[..., ISTEER, IRATE] = dt
    return A, B
