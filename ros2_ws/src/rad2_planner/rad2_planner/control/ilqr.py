"""Batched iLQR for trajectory tracking with the kinematic bicycle (RAD-2 Eq. 10).

Problem, solved independently for every row ``b`` of a batch::

    min_u  sum_{k=1..H} (x_k - r_k)^T Q_k (x_k - r_k) + sum_{k=0..H-1} u_k^T R u_k
    s.t.   x_{k+1} = f(x_k, u_k)   (midpoint bicycle step, ``bicycle.step``),  x_0 given,
           a_min <= a <= a_max,  |delta_dot| <= delta_dot_max,          (input box)
           0 <= v <= v_max,      |delta| <= delta_max                   (state box, via the inputs)

with Q_k = diag(q) and Q_H = terminal_scale * diag(q). The yaw error is a plain difference: the
reference heading is unwrapped and starts near the ego's yaw (``reference.py``), and the simulated
yaw is never wrapped.

Method
------
- Gauss-Newton iLQR: first-order dynamics (analytic Jacobians), exact quadratic cost. The backward
  pass runs on homogeneous coordinates ``z = (1, dx)``, so Q_x, Q_u, Q_xx, Q_ux, Q_uu come out of one
  8x8 product per step, and the policy is ``du = k + K dx``.
- Input limits, clamped-control (projected) iLQR: the forward pass projects every input onto the
  feasible set of the current state (``bicycle.clamp_controls``: acceleration and steering-rate boxes,
  plus speed in [0, v_max] and steering angle within +-delta_max, which are input bounds one step
  ahead because v and delta are integrated exactly). In the backward pass an input dimension whose
  nominal value sits on its bound while the gradient Q_u pushes further out is held fixed (its row of
  k and K is zero and Q_uu is solved on the free dimensions only), the active-set rule of projected
  Newton methods.
- Levenberg-Marquardt regularisation: mu * I added to Q_uu, per problem; divided by
  ``reg_decrease`` after an accepted step (dropped below ``reg_min``), multiplied by ``reg_increase``
  after a rejected one; a problem whose mu exceeds ``reg_max`` stops (not converged).
- Line search: all step sizes ``alphas`` are rolled out in parallel (one batched forward pass of
  shape [B, n_alpha]); the lowest cost is accepted if it is below the current cost.
- Converged when an accepted step lowers the cost by less than ``rel_tolerance`` (relative), or the
  largest feed-forward step |k| is below ``step_tolerance``.
- Warm start: the caller passes an initial control sequence (``reference.shift_controls`` shifts the
  previous solution); the iteration cap is then ``max_iterations_warm``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rad2_planner.control.bicycle import ISTEER, IV, NU, NX, VehicleParams, jacobians


class ControllerParamsError(ValueError):
    """A controller parameter is missing or out of range."""


def _num(
    block: dict[str, Any], key: str, prefix: str, positive: bool = True, allow_zero: bool = False
) -> float:
    if key not in block:
        raise ControllerParamsError(f"missing parameter {prefix}.{key}")
    try:
        value = float(block[key])
    except (TypeError, ValueError):
        raise ControllerParamsError(f"{prefix}.{key} must be a number, got {block[key]!r}") from None
    if not np.isfinite(value) or (positive and (value < 0.0 or (value == 0.0 and not allow_zero))):
        need = "non-negative" if allow_zero else "positive"
        raise ControllerParamsError(f"{prefix}.{key} must be {need}, got {block[key]!r}")
    return value


@dataclass(frozen=True)
class CostWeights:
    """Diagonal weights: q over (x, y, yaw, v, steer), r over (accel, steer_rate)."""

    q: np.ndarray
    r: np.ndarray
    terminal_scale: float

    @classmethod
    def from_params(cls, block: dict[str, Any]) -> CostWeights:
        w = block.get("weights")
        if not isinstance(w, dict):
            raise ControllerParamsError("missing parameter controller.weights")
        p = "controller.weights"
        q = np.array([_num(w, k, p, allow_zero=True) for k in ("x", "y", "yaw", "speed", "steer")])
        r = np.array([_num(w, k, p) for k in ("accel", "steer_rate")])
        return cls(q=q, r=r, terminal_scale=_num(w, "terminal_scale", p, allow_zero=True))


@dataclass(frozen=True)
class ILQRSettings:
    max_iterations: int
    max_iterations_warm: int
    rel_tolerance: float
    step_tolerance: float
    alphas: tuple[float, ...]
    reg_init: float
    reg_min: float
    reg_max: float
    reg_increase: float
    reg_decrease: float

    @classmethod
    def from_params(cls, block: dict[str, Any]) -> ILQRSettings:
        s = block.get("ilqr")
        if not isinstance(s, dict):
            raise ControllerParamsError("missing parameter controller.ilqr")
        p = "controller.ilqr"
        alphas = s.get("line_search_alphas")
        try:
            alphas = tuple(float(a) for a in alphas)
        except (TypeError, ValueError):
            raise ControllerParamsError(
                f"{p}.line_search_alphas must be a list of numbers, got {alphas!r}"
            ) from None
        if not alphas or any(not (0.0 < a <= 1.0) for a in alphas):
            raise ControllerParamsError(
                f"{p}.line_search_alphas must be non-empty values in (0, 1], got {alphas!r}"
            )
        out = cls(
            max_iterations=int(_num(s, "max_iterations", p)),
            max_iterations_warm=int(_num(s, "max_iterations_warm", p)),
            rel_tolerance=_num(s, "rel_tolerance", p),
            step_tolerance=_num(s, "step_tolerance", p),
            alphas=alphas,
            reg_init=_num(s, "reg_init", p, allow_zero=True),
            reg_min=_num(s, "reg_min", p),
            reg_max=_num(s, "reg_max", p),
            reg_increase=_num(s, "reg_increase", p),
            reg_decrease=_num(s, "reg_decrease", p),
        )
        if out.reg_increase <= 1.0:
            raise ControllerParamsError(f"{p}.reg_increase must exceed 1, got {out.reg_increase!r}")
        if not 0.0 < out.reg_decrease < 1.0:
            raise ControllerParamsError(f"{p}.reg_decrease must lie in (0, 1), got {out.reg_decrease!r}")
        return out


@dataclass
class SolveReport:
    """Per-problem convergence report of one batched solve (arrays of length B)."""

    iterations: np.ndarray
    initial_cost: np.ndarray
    final_cost: np.ndarray
    converged: np.ndarray
    regularization: np.ndarray
    solve_time_ms: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def cost_reduction(self) -> np.ndarray:
        """Relative decrease (initial - final) / initial, per problem."""
        return (self.initial_cost - self.final_cost) / np.maximum(self.initial_cost, 1e-12)

    def problem(self, b: int) -> dict[str, Any]:
        return {
            "iterations": int(self.iterations[b]),
            "initial_cost": float(self.initial_cost[b]),
            "final_cost": float(self.final_cost[b]),
            "cost_reduction": float(self.cost_reduction[b]),
            "converged": bool(self.converged[b]),
            "regularization": float(self.regularization[b]),
        }


def tracking_cost(
    states: np.ndarray, controls: np.ndarray, ref: np.ndarray, weights: CostWeights
) -> np.ndarray:
    """Eq. 10 cost. states [..., H+1, 5], controls [..., H, 2], ref [..., H, 5] -> [...]."""
    err = states[..., 1:, :] - ref
    e2 = err * err * weights.q
    cost = e2.sum(axis=(-1, -2)) + (weights.terminal_scale - 1.0) * e2[..., -1, :].sum(axis=-1)
    return cost + (controls * controls * weights.r).sum(axis=(-1, -2))


class _Problem:
    """Constant data of one batched solve, precomputed once."""

    def __init__(self, x0, ref, vehicle: VehicleParams, dt: float, weights: CostWeights):
        self.x0 = x0
        self.ref = ref
        self.vehicle = vehicle
        self.dt = dt
        self.weights = weights
        self.b, self.h = ref.shape[0], ref.shape[1]
        lo, hi = vehicle.control_bounds()
        slo, shi = vehicle.state_bounds()
        self.ulo, self.uhi, self.slo, self.shi = lo, hi, slo, shi
        self.qk = np.repeat(weights.q[None, :], self.h, axis=0)  # weight of x_{k+1}, k = 0..H-1
        self.qk[-1] *= weights.terminal_scale

    def forward(self, xs_nom, u_open, gain) -> tuple[np.ndarray, np.ndarray]:
        """Closed-loop rollout of ``u = u_open + K (x - xs_nom)`` with input projection.

        u_open: [B, N, H, 2] (N candidates per problem, e.g. line-search steps), gain: K [B, H, 2, 5]
        or None (open loop). Returns states [B, N, H+1, 5] and applied controls [B, N, H, 2].
        """
        v = self.vehicle
        dt, half, inv_dt = self.dt, 0.5 * self.dt, 1.0 / self.dt
        rho, inv_l = v.rho, 1.0 / v.wheelbase
        inv_lr = 1.0 / v.rear_axle_to_center if rho > 0.0 else 0.0
        b, n = u_open.shape[0], u_open.shape[1]
        # Component-major buffers: xs[t, i] is the (B, N) array of state component i at step t.
        xs = np.empty((self.h + 1, NX, b, n))
        us = np.empty((self.h, NU, b, n))
        xs[0] = self.x0.T[:, :, None]
        ulo = self.ulo[:, None, None]
        uhi = self.uhi[:, None, None]
        slo = self.slo[:, None, None]
        shi = self.shi[:, None, None]
        # u_t = c_t + K_t x_t with c_t = u_open_t - K_t xs_nom_t (all t at once).
        if gain is None:
            c = np.ascontiguousarray(u_open.transpose(2, 3, 0, 1))
        else:
            c = u_open - np.matmul(gain, xs_nom[:, :-1, :, None])[:, None, :, :, 0]
            c = np.ascontiguousarray(c.transpose(2, 3, 0, 1))  # [H, 2, B, N]
            gain_t = np.ascontiguousarray(gain.transpose(1, 0, 2, 3))  # [H, B, 2, 5]
        pair = np.empty((2, b, n))
        nxt = np.empty((2, b, n))
        for t in range(self.h):
            x = xs[t]
            if gain is None:
                u = c[t].copy()
            else:
                u = np.matmul(gain_t[t], x.transpose(1, 0, 2)).transpose(1, 0, 2)
                u += c[t]
            np.maximum(u, ulo, out=u)
            np.minimum(u, uhi, out=u)
            vd = x[IV:]
            np.multiply(u, dt, out=nxt)
            nxt += vd
            np.maximum(nxt, slo, out=nxt)
            np.minimum(nxt, shi, out=nxt)
            ut = us[t]
            np.subtract(nxt, vd, out=ut)
            ut *= inv_dt
            pair[0] = x[ISTEER]
            np.add(x[ISTEER], nxt[1], out=pair[1])
            pair[1] *= 0.5
            if rho > 0.0:  # kappa = sin(beta) / l_r, beta = atan(rho tan(delta))
                beta = np.arctan(np.multiply(np.tan(pair), rho))
                kap = np.sin(beta)
                kap *= inv_lr
            else:
                beta = np.zeros_like(pair)
                kap = np.tan(pair)
                kap *= inv_l
            th = half * x[IV] * kap[0]
            th += x[2]
            th += beta[1]
            dist = (x[IV] + nxt[0]) * half
            xn = xs[t + 1]
            np.add(x[0], dist * np.cos(th), out=xn[0])
            np.add(x[1], dist * np.sin(th), out=xn[1])
            np.add(x[2], dist * kap[1], out=xn[2])
            xn[IV:] = nxt
        return xs.transpose(2, 3, 0, 1), us.transpose(2, 3, 0, 1)

    def cost(self, xs, us):
        err = xs[..., 1:, :] - self.ref[:, None] if xs.ndim == 4 else xs[..., 1:, :] - self.ref
        return (err * err * self.qk).sum(axis=(-1, -2)) + (us * us * self.weights.r).sum(axis=(-1, -2))

    def backward(self, xs, us, mu):
        """Riccati sweep around (xs [B,H+1,5], us [B,H,2]).

        Returns gains kK [B, H, 2, 6] = [k | K] and the decrease [B] the local model predicts for a
        full step.
        """
        b, h = self.b, self.h
        A, Bm = jacobians(xs[:, :-1], us, self.vehicle, self.dt)
        # Homogeneous dynamics: (1, dx') = Fh (1, dx, du)
        Fh = np.zeros((b, h, 6, 8))
        Fh[..., 0, 0] = 1.0
        Fh[..., 1:, 1:6] = A
        Fh[..., 1:, 6:] = Bm
        FhT = np.ascontiguousarray(Fh.swapaxes(-1, -2))
        # Stage cost of step k in homogeneous coordinates: state part is x_k's (0 for k = 0).
        err = xs[:, 1:] - self.ref  # err[:, k] belongs to x_{k+1}
        two_q = 2.0 * self.qk
        L = np.zeros((b, h, 8, 8))
        gx = 2.0 * self.qk[None, :-1] * err[:, :-1]
        L[:, 1:, 0, 1:6] = gx
        L[:, 1:, 1:6, 0] = gx
        gu = 2.0 * self.weights.r * us
        L[:, :, 0, 6:] = gu
        L[:, :, 6:, 0] = gu
        idx = np.arange(5)
        L[:, 1:, 1 + idx, 1 + idx] = two_q[None, :-1]
        L[:, :, 6, 6] = 2.0 * self.weights.r[0] + mu[:, None]
        L[:, :, 7, 7] = 2.0 * self.weights.r[1] + mu[:, None]
        # Active input bounds at the nominal (state-dependent, see bicycle.clamp_controls).
        vd = xs[:, :-1, IV:]
        lo_eff = np.maximum(self.ulo, (self.slo - vd) / self.dt)
        hi_eff = np.minimum(self.uhi, (self.shi - vd) / self.dt)
        eps = 1e-9
        at_lo = us <= lo_eff + eps
        at_hi = us >= hi_eff - eps
        any_active = (at_lo | at_hi).any(axis=(0, 2))

        P = np.zeros((b, 6, 6))
        gT = 2.0 * self.qk[-1] * err[:, -1]
        P[:, 0, 1:] = gT
        P[:, 1:, 0] = gT
        P[:, 1 + idx, 1 + idx] = two_q[-1]
        kK = np.empty((b, h, 2, 6))
        eye2 = np.eye(2)
        for k in range(h - 1, -1, -1):
            M = np.matmul(FhT[:, k], np.matmul(P, Fh[:, k]))
            M += L[:, k]
            Muu = M[:, 6:, 6:]
            G = M[:, 6:, :6]
            if any_active[k]:
                qu = G[:, :, 0]
                clamped = (at_hi[:, k] & (qu < 0.0)) | (at_lo[:, k] & (qu > 0.0))
                free = (~clamped).astype(np.float64)
                Muu_s = Muu * (free[:, :, None] * free[:, None, :]) + (1.0 - free)[:, :, None] * eye2
                gain = _solve2(Muu_s, G * free[:, :, None], kK[:, k])
            else:
                gain = _solve2(Muu, G, kK[:, k])
            # With gain = -Muu^-1 G on the free inputs (zero rows elsewhere), the Riccati update
            # Mzz + gain^T Muu gain + gain^T G + G^T gain reduces to Mzz + G^T gain.
            P = np.matmul(G.swapaxes(-1, -2), gain)
            P += M[:, :6, :6]
        # P[0, 0] accumulated sum_k (-Qu^T Quu^-1 Qu): twice the model's cost change of a full step.
        return kK, -0.5 * P[:, 0, 0]


def _solve2(m: np.ndarray, g: np.ndarray, out: np.ndarray) -> np.ndarray:
    """out = -m^{-1} g for symmetric 2x2 m [B, 2, 2] and g [B, 2, n] (closed form)."""
    a, c, d = m[:, 0, 0:1], m[:, 0, 1:2], m[:, 1, 1:2]
    inv_det = 1.0 / (a * d - c * c)
    g0, g1 = g[:, 0], g[:, 1]
    np.multiply(c * g1 - d * g0, inv_det, out=out[:, 0])
    np.multiply(c * g0 - a * g1, inv_det, out=out[:, 1])
    return out


def ilqr_solve(
    x0: np.ndarray,
    ref: np.ndarray,
    u_init: np.ndarray,
    vehicle: VehicleParams,
    dt: float,
    weights: CostWeights,
    settings: ILQRSettings,
    max_iterations: int | None = None,
) -> tuple[np.ndarray, np.ndarray, SolveReport]:
    """Solve B tracking problems. x0 [B, 5], ref [B, H, 5], u_init [B, H, 2].

    Returns (controls [B, H, 2], states [B, H+1, 5], report). The returned controls are the applied
    (projected) inputs, so re-rolling them out with ``bicycle.rollout`` gives ``states`` exactly.
    """
    start = time.perf_counter()
    x0 = np.ascontiguousarray(x0, dtype=np.float64)
    ref = np.ascontiguousarray(ref, dtype=np.float64)
    u_init = np.asarray(u_init, dtype=np.float64)
    prob = _Problem(x0, ref, vehicle, dt, weights)
    b = prob.b
    iters_cap = settings.max_iterations if max_iterations is None else int(max_iterations)
    alphas = np.asarray(settings.alphas)

    xs, us = prob.forward(None, u_init[:, None], None)
    xs, us = xs[:, 0], us[:, 0]
    cost = prob.cost(xs, us)
    initial_cost = cost.copy()
    mu = np.full(b, settings.reg_init)
    iterations = np.zeros(b, dtype=np.int64)
    converged = np.zeros(b, dtype=bool)
    active = np.ones(b, dtype=bool)
    rows = np.arange(b)
    for _ in range(iters_cap):
        kK, predicted = prob.backward(xs, us, mu)
        bad = ~np.isfinite(kK).all(axis=(1, 2, 3)) | ~np.isfinite(predicted)
        if bad.any():
            kK[bad] = 0.0
            predicted[bad] = 0.0
        k_ff = kK[..., 0]
        step = np.abs(k_ff).max(axis=(1, 2))
        # Stationary already: the local model promises (almost) nothing, so skip the rollout.
        done_now = (
            active
            & ~bad
            & (
                (step < settings.step_tolerance)
                | (predicted < settings.rel_tolerance * np.maximum(cost, 1e-12))
            )
        )
        if done_now.any():
            converged |= done_now
            iterations += done_now
            active &= ~done_now
            if not active.any():
                break
        u_open = us[:, None] + alphas[None, :, None, None] * k_ff[:, None]
        cand_x, cand_u = prob.forward(xs, u_open, kK[..., 1:])
        cand_cost = prob.cost(cand_x, cand_u)
        best = np.argmin(cand_cost, axis=1)
        new_cost = cand_cost[rows, best]
        accept = active & ~bad & (new_cost < cost)
        iterations += active
        small_step = active & (step < settings.step_tolerance)
        small_gain = accept & ((cost - new_cost) < settings.rel_tolerance * np.maximum(cost, 1e-12))
        if accept.any():
            xs = np.where(accept[:, None, None], cand_x[rows, best], xs)
            us = np.where(accept[:, None, None], cand_u[rows, best], us)
            cost = np.where(accept, new_cost, cost)
        mu = np.where(
            accept,
            mu * settings.reg_decrease,
            np.where(active, np.maximum(mu, settings.reg_min) * settings.reg_increase, mu),
        )
        mu = np.where(mu < settings.reg_min, 0.0, mu)
        converged |= small_step | small_gain
        active &= ~(small_step | small_gain) & (mu <= settings.reg_max)
        if not active.any():
            break
    report = SolveReport(
        iterations=iterations,
        initial_cost=initial_cost,
        final_cost=cost,
        converged=converged,
        regularization=mu,
        solve_time_ms=(time.perf_counter() - start) * 1e3,
    )
    return us, xs, report
