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
  nominal value sits on its bound while the gradient Q_u pushes further out is held on that bound
  (its k is zero and the other input is solved for alone), the active-set rule of projected Newton
  methods. Held on an input-box bound, its feedback K is zero; held on the speed (steering-angle)
  limit, the bound moves with the state (a >= -v/dt keeps v >= 0), so its feedback is -1/dt on v
  (delta) and it stays on the limit under state deviations, which the forward projection does too.
  (With zero feedback there the linear model lets a stopped vehicle reverse, the predicted decrease
  is not attainable and the line search fails repeatedly near stops.)
- Levenberg-Marquardt regularisation: mu * I added to Q_uu, per problem; multiplied by
  ``reg_decrease`` after an accepted step (dropped to 0 below ``reg_min``), multiplied by
  ``reg_increase`` after a rejected one or a non-finite backward pass; a problem whose mu exceeds
  ``reg_max`` stops (not converged).
- Line search: the first of the step sizes ``alphas`` (the full step, 1) is taken if its rollout
  costs less than the current cost; otherwise the cheapest of the other step sizes, if it costs
  less than the current cost.
- Converged when an accepted step lowers the cost by less than ``rel_tolerance`` (relative), or,
  before the rollout, when the largest feed-forward step |k| is below ``step_tolerance`` or the
  decrease the local model predicts is below ``rel_tolerance`` (relative).
- Warm start: the caller passes an initial control sequence (``reference.shift_controls`` shifts the
  previous solution); the iteration cap is then ``max_iterations_warm``.

Kernels
-------
``ilqr_solve`` is the iteration above (regularisation, line-search rule, convergence tests), written
once over a batch of problems; the linearisation (Jacobian entries, cost gradients, active bounds) is
computed vectorised over problems and steps. The parts that are sequential in time, the rollouts and
the Riccati sweep, come in two forms: ``_BatchKernel`` (each step a handful of numpy operations over
the batch, all line-search step sizes rolled out at once) and, for batches of at most
``SMALL_BATCH`` problems, ``_SmallKernel`` on Python floats (``kernel`` forces one; tests check that
they agree). The float kernel exists because a batch of one, the controller node's case, is several
times slower in numpy, whose per-call overhead dominates on 1-row arrays. Median ms per solve,
H = 40, dt = 0.1 s, the 40 problems of ``benchmarks.ilqr.make_plans`` x 7 repetitions, pinned to
one core of a 2-CPU machine at load average 0.8:

    ========================  ==========  ==========
    one problem               cold start  warm start
    ========================  ==========  ==========
    numpy kernel, batch of 1  3.89        2.48
    float kernel              1.04        0.68
    ========================  ==========  ==========

From about 16 problems on, the numpy kernel is the faster one (64 problems: 43 ms against 58 ms).

One module, about 900 lines, on purpose: the batched kernel and the scalar fast path above are one
algorithm (ilqr_solve's regularisation, line search and stopping rule serve both), and the test that
keeps them equal reads them side by side; the cost, the limits and the warm start are the rest.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
from rad2_core.bicycle import (
    IA,
    IRATE,
    ISTEER,
    IV,
    JAC_A_INDEX,
    JAC_B_INDEX,
    NU,
    NX,
    VehicleParams,
    jacobian_entries,
)


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


# An input within this of its (state-dependent) bound counts as on it.
_ACTIVE_EPS = 1e-9
# Where the entries of ``bicycle.jacobian_entries`` go in the homogeneous dynamics Fh [6, 8].
_FH_ROWS = np.array([1 + r for r, _ in JAC_A_INDEX] + [1 + r for r, _ in JAC_B_INDEX])
_FH_COLS = np.array([1 + c for _, c in JAC_A_INDEX] + [6 + c for _, c in JAC_B_INDEX])


class _Linearisation(NamedTuple):
    """The local model of a batch of problems around their nominal trajectories ([n, H, ...])."""

    jac: np.ndarray  # [n, H, 14] bicycle.jacobian_entries at (x_k, u_k)
    gx: np.ndarray  # [n, H, 5] cost gradient in x_{k+1}
    gu: np.ndarray  # [n, H, 2] cost gradient in u_k
    at_lo: np.ndarray  # [n, H, 2] u_k on its lower / upper bound
    at_hi: np.ndarray
    state_lo: np.ndarray  # ... and that bound is the speed / steering limit, not the input box
    state_hi: np.ndarray


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

    def linearise(self, xs, us, rows=slice(None)) -> _Linearisation:
        """What either Riccati sweep needs around the nominal trajectories xs [n, H+1, 5], us [n, H, 2]
        of the problems ``rows``, computed for all of them and all steps at once."""
        vd = xs[:, :-1, IV:]
        # Active input bounds at the nominal (state-dependent, see bicycle.clamp_controls).
        lo_eff = np.maximum(self.ulo, (self.slo - vd) / self.dt)
        hi_eff = np.minimum(self.uhi, (self.shi - vd) / self.dt)
        at_lo = us <= lo_eff + _ACTIVE_EPS
        at_hi = us >= hi_eff - _ACTIVE_EPS
        return _Linearisation(
            jac=jacobian_entries(xs[:, :-1], us, self.vehicle, self.dt),
            gx=2.0 * self.qk * (xs[:, 1:] - self.ref[rows]),
            gu=2.0 * self.weights.r * us,
            at_lo=at_lo,
            at_hi=at_hi,
            state_lo=at_lo & (lo_eff > self.ulo),
            state_hi=at_hi & (hi_eff < self.uhi),
        )

    def backward(self, lin: _Linearisation, mu):
        """Riccati sweep of all B problems at once, on homogeneous coordinates.

        Returns gains kK [B, H, 2, 6] = [k | K] and the decrease [B] the local model predicts for a
        full step.
        """
        b, h = self.b, self.h
        # Homogeneous dynamics: (1, dx') = Fh (1, dx, du), A = I + entries, B = entries + dt on (v, delta)
        Fh = np.zeros((b, h, 6, 8))
        Fh[..., 0, 0] = 1.0
        idx = np.arange(5)
        Fh[..., 1 + idx, 1 + idx] = 1.0
        Fh[..., _FH_ROWS, _FH_COLS] = lin.jac
        Fh[..., 1 + IV, 6 + IA] = self.dt
        Fh[..., 1 + ISTEER, 6 + IRATE] = self.dt
        FhT = np.ascontiguousarray(Fh.swapaxes(-1, -2))
        # Stage cost of step k in homogeneous coordinates: state part is x_k's (0 for k = 0).
        two_q = 2.0 * self.qk
        L = np.zeros((b, h, 8, 8))
        gx = lin.gx[:, :-1]  # gradient in x_k, k = 1..H-1
        L[:, 1:, 0, 1:6] = gx
        L[:, 1:, 1:6, 0] = gx
        L[:, :, 0, 6:] = lin.gu
        L[:, :, 6:, 0] = lin.gu
        L[:, 1:, 1 + idx, 1 + idx] = two_q[None, :-1]
        L[:, :, 6, 6] = 2.0 * self.weights.r[0] + mu[:, None]
        L[:, :, 7, 7] = 2.0 * self.weights.r[1] + mu[:, None]
        at_lo, at_hi, state_lo, state_hi = lin.at_lo, lin.at_hi, lin.state_lo, lin.state_hi
        any_active = (at_lo | at_hi).any(axis=(0, 2))
        eye8 = np.eye(8)

        P = np.zeros((b, 6, 6))
        gT = lin.gx[:, -1]
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
            kc = None
            if any_active[k]:
                qu = G[:, :, 0]
                hold_hi = at_hi[:, k] & (qu < 0.0)
                hold_lo = at_lo[:, k] & (qu > 0.0)
                clamped = hold_hi | hold_lo
                # A held input on a speed / steering limit keeps the state on it: du = kc dx with
                # kc = -1/dt on that state (module docstring); substitute du = du' + kc dx.
                kc = ((hold_hi & state_hi[:, k]) | (hold_lo & state_lo[:, k])) * (-1.0 / self.dt)
                if kc.any():
                    T = np.broadcast_to(eye8, (b, 8, 8)).copy()
                    T[:, 6, 1 + IV] = kc[:, 0]
                    T[:, 7, 1 + ISTEER] = kc[:, 1]
                    M = np.matmul(T.swapaxes(-1, -2), np.matmul(M, T))
                    Muu = M[:, 6:, 6:]
                    G = M[:, 6:, :6]
                else:
                    kc = None
                free = (~clamped).astype(np.float64)
                Muu_s = Muu * (free[:, :, None] * free[:, None, :]) + (1.0 - free)[:, :, None] * eye2
                gain = _solve2(Muu_s, G * free[:, :, None], kK[:, k])
            else:
                gain = _solve2(Muu, G, kK[:, k])
            # With gain = -Muu^-1 G on the free inputs (zero rows elsewhere), the Riccati update
            # Mzz + gain^T Muu gain + gain^T G + G^T gain reduces to Mzz + G^T gain.
            P = np.matmul(G.swapaxes(-1, -2), gain)
            P += M[:, :6, :6]
            if kc is not None:
                kK[:, k, 0, 1 + IV] += kc[:, 0]
                kK[:, k, 1, 1 + ISTEER] += kc[:, 1]
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


# Batches of at most this many problems run on the per-problem kernel (``_SmallKernel``), larger
# ones on the batched numpy kernel (``_BatchKernel``). Both compute the same iterates; this only picks
# the faster one.
SMALL_BATCH = 8

_KERNELS = ("auto", "numpy", "small")


class _BatchKernel:
    """Every problem of the batch in each numpy operation: the backward sweep on [B] stacks of 8x8
    matrices, all line-search step sizes rolled out at once as [B, n_alpha]."""

    name = "numpy"

    def __init__(self, prob: _Problem, u_init: np.ndarray, alphas: tuple[float, ...]):
        self.prob = prob
        self.alphas = np.asarray(alphas)
        self.rows = np.arange(prob.b)
        xs, us = prob.forward(None, u_init[:, None], None)
        self.xs, self.us = xs[:, 0], us[:, 0]
        self.cost = prob.cost(self.xs, self.us)

    def backward(self, mu: np.ndarray, rows: np.ndarray):
        """(predicted decrease, max |k|, not finite) per problem; ``rows`` is ignored: sweeping
        converged problems too costs less than selecting the others."""
        kK, predicted = self.prob.backward(self.prob.linearise(self.xs, self.us), mu)
        bad = ~np.isfinite(kK).all(axis=(1, 2, 3)) | ~np.isfinite(predicted)
        if bad.any():
            kK[bad] = 0.0
            predicted[bad] = 0.0
        self.kK = kK
        return predicted, np.abs(kK[..., 0]).max(axis=(1, 2)), bad

    def line_search(self, rows: np.ndarray, cost: np.ndarray) -> np.ndarray:
        """Cost of the step each problem would take (the line-search rule of the module docstring)."""
        k_ff = self.kK[..., 0]
        u_open = self.us[:, None] + self.alphas[None, :, None, None] * k_ff[:, None]
        cand_x, cand_u = self.prob.forward(self.xs, u_open, self.kK[..., 1:])
        cand_cost = self.prob.cost(cand_x, cand_u)
        cand_cost = np.where(np.isnan(cand_cost), np.inf, cand_cost)
        # The first (full) step if it lowers the cost, else the cheapest of the others.
        best = np.where(cand_cost[:, 0] < cost, 0, np.argmin(cand_cost, axis=1))
        self.candidate = (cand_x, cand_u, best)
        return cand_cost[self.rows, best]

    def accept(self, mask: np.ndarray) -> None:
        cand_x, cand_u, best = self.candidate
        self.xs = np.where(mask[:, None, None], cand_x[self.rows, best], self.xs)
        self.us = np.where(mask[:, None, None], cand_u[self.rows, best], self.us)

    def trajectories(self) -> tuple[np.ndarray, np.ndarray]:
        return self.xs, self.us


class _SmallKernel:
    """One problem at a time on Python floats, where numpy's per-call overhead on 1-row arrays would
    dominate; the linearisation is still computed for all problems at once. The rollout and the sweep
    are ``_Problem.forward`` and ``_Problem.backward`` on floats. The line search rolls out the other
    step sizes only if the full step fails and abandons a rollout as soon as its partial cost (a sum
    of non-negative terms) reaches the cost to beat: the same choice as ``_BatchKernel.line_search``.

    Trajectories are lists of tuples; per-step gains are tuples
    ``(k_0, k_1, (K x_nom)_0, (K x_nom)_1, K_00..K_04, K_10..K_14)``.
    """

    name = "small"

    def __init__(self, prob: _Problem, u_init: np.ndarray, alphas: tuple[float, ...]):
        veh = prob.vehicle
        self.prob, self.alphas, self.dt, self.h = prob, alphas, prob.dt, prob.h
        self.x0s = [tuple(x) for x in prob.x0.tolist()]
        self.refs = [[tuple(r) for r in ref] for ref in prob.ref.tolist()]
        self.q = tuple(prob.weights.q.tolist())
        self.q_last = tuple(prob.qk[-1].tolist())
        self.r = tuple(prob.weights.r.tolist())
        self.two_q = tuple((2.0 * prob.qk[0]).tolist())
        self.two_q_last = tuple((2.0 * prob.qk[-1]).tolist())
        self.limits = (*prob.ulo.tolist(), *prob.uhi.tolist(), *prob.slo.tolist(), *prob.shi.tolist())
        self.rho = veh.rho
        self.inv_lr = 1.0 / veh.rear_axle_to_center if veh.rho > 0.0 else 0.0
        self.inv_l = 1.0 / veh.wheelbase
        self.xs, self.us, cost = [], [], []
        self.gains: list = [None] * prob.b
        self.candidate: list = [None] * prob.b
        for i, u in enumerate(u_init):
            # limit nan: never abandoned (an overflowing cost stays inf, as in the batched kernel)
            out = self.rollout(i, u.tolist(), None, 1.0, math.nan)
            # None: the rollout left the model's domain; reported as the numpy kernel would
            xs, us, c = out or ([self.x0s[i]] + [(math.nan,) * NX] * self.h, u.tolist(), math.nan)
            self.xs.append(xs)
            self.us.append(us)
            cost.append(c)
        self.cost = np.array(cost)

    def backward(self, mu: np.ndarray, rows: np.ndarray):
        """(predicted decrease, max |k|, not finite) of the problems ``rows`` (zeros elsewhere)."""
        b = self.prob.b
        predicted, step, bad = np.zeros(b), np.zeros(b), np.zeros(b, dtype=bool)
        idx = rows.nonzero()[0]
        if not len(idx):
            return predicted, step, bad
        lin = self.prob.linearise(
            np.array([self.xs[i] for i in idx]), np.array([self.us[i] for i in idx]), idx
        )
        flags = lin.at_lo + 2 * lin.at_hi + 4 * lin.state_lo + 8 * lin.state_hi
        rows_of = zip(lin.jac.tolist(), lin.gx.tolist(), lin.gu.tolist(), flags.tolist())
        for i, (jac, gx, gu, fl) in zip(idx.tolist(), rows_of):
            out = self.sweep(self.xs[i], jac, gx, gu, fl, float(mu[i]))
            if out is None:
                bad[i] = True
            else:
                self.gains[i], predicted[i], step[i] = out
        return predicted, step, bad

    def line_search(self, rows: np.ndarray, cost: np.ndarray) -> np.ndarray:
        new_cost = np.full(self.prob.b, np.inf)
        first, others = self.alphas[0], self.alphas[1:]
        for i in rows.nonzero()[0].tolist():
            us, gains, c = self.us[i], self.gains[i], float(cost[i])
            cand = self.rollout(i, us, gains, first, c)
            if cand is None or not cand[2] < c:  # else the full step is taken
                cand, best = None, c
                for alpha in others:
                    trial = self.rollout(i, us, gains, alpha, best)
                    if trial is not None and trial[2] < best:
                        cand, best = trial, trial[2]
            self.candidate[i] = cand
            if cand is not None:
                new_cost[i] = cand[2]
        return new_cost

    def accept(self, mask: np.ndarray) -> None:
        for i in mask.nonzero()[0].tolist():
            self.xs[i], self.us[i], _ = self.candidate[i]

    def trajectories(self) -> tuple[np.ndarray, np.ndarray]:
        return np.array(self.xs, dtype=np.float64), np.array(self.us, dtype=np.float64)

    def rollout(self, i: int, u_nom, gains, alpha: float, limit: float):
        """Problem i's rollout of ``u = u_nom + alpha k + K (x - x_nom)`` (``gains`` None: ``u = u_nom``)
        with input projection. Returns (states, applied inputs, cost), or None as soon as the partial
        cost reaches ``limit`` (nan: never) or the rollout leaves the model's domain."""
        tan, atan, sin, cos = math.tan, math.atan, math.sin, math.cos
        dt = self.dt
        half, inv_dt = 0.5 * dt, 1.0 / dt
        rho, inv_lr, inv_l = self.rho, self.inv_lr, self.inv_l
        a_lo, r_lo, a_hi, r_hi, v_lo, d_lo, v_hi, d_hi = self.limits
        q0, q1, q2, q3, q4 = self.q
        r0, r1 = self.r
        last = self.h - 1
        ref = self.refs[i]
        x, y, yaw, v, d = xs0 = self.x0s[i]
        xs = [xs0]
        us = []
        cost = 0.0
        try:
            for t in range(self.h):
                u0, u1 = u_nom[t]
                if gains is not None:
                    k0, k1, c0, c1, K00, K01, K02, K03, K04, K10, K11, K12, K13, K14 = gains[t]
                    u0 = K00 * x + K01 * y + K02 * yaw + K03 * v + K04 * d + ((u0 + alpha * k0) - c0)
                    u1 = K10 * x + K11 * y + K12 * yaw + K13 * v + K14 * d + ((u1 + alpha * k1) - c1)
                if u0 < a_lo:
                    u0 = a_lo
                elif u0 > a_hi:
                    u0 = a_hi
                if u1 < r_lo:
                    u1 = r_lo
                elif u1 > r_hi:
                    u1 = r_hi
                nv = u0 * dt + v
                if nv < v_lo:
                    nv = v_lo
                elif nv > v_hi:
                    nv = v_hi
                nd = u1 * dt + d
                if nd < d_lo:
                    nd = d_lo
                elif nd > d_hi:
                    nd = d_hi
                u0 = (nv - v) * inv_dt
                u1 = (nd - d) * inv_dt
                dm = (d + nd) * 0.5
                if rho > 0.0:  # kappa = sin(beta) / l_r, beta = atan(rho tan(delta))
                    kap0 = sin(atan(tan(d) * rho)) * inv_lr
                    beta1 = atan(tan(dm) * rho)
                    kap1 = sin(beta1) * inv_lr
                else:
                    kap0 = tan(d) * inv_l
                    beta1 = 0.0
                    kap1 = tan(dm) * inv_l
                th = half * v * kap0 + yaw + beta1
                dist = (v + nv) * half
                x = x + dist * cos(th)
                y = y + dist * sin(th)
                yaw = yaw + dist * kap1
                v = nv
                d = nd
                xs.append((x, y, yaw, v, d))
                us.append((u0, u1))
                rx, ry, ryaw, rv, rd = ref[t]
                ex, ey, eyaw, ev, ed = x - rx, y - ry, yaw - ryaw, v - rv, d - rd
                if t == last:
                    q0, q1, q2, q3, q4 = self.q_last
                cost += (
                    ex * ex * q0
                    + ey * ey * q1
                    + eyaw * eyaw * q2
                    + ev * ev * q3
                    + ed * ed * q4
                    + u0 * u0 * r0
                    + u1 * u1 * r1
                )
                if cost >= limit:
                    return None
        except (ValueError, OverflowError):  # math.* outside their domain: inf states
            return None
        return xs, us, cost

    def sweep(self, xs, jac, gx, gu, flags, mu: float):
        """Riccati sweep as ``_Problem.backward`` for one problem, exploiting the sparsity of A and B.
        ``jac``, ``gx``, ``gu``, ``flags``: its rows of ``_Problem.linearise`` as lists (flags 1 / 2 on
        the lower / upper bound, 4 / 8 if that bound is the speed or steering limit).

        Returns (gains, predicted decrease of a full step, max |k|), or None if not finite.
        """
        dt = self.dt
        inv_dt = 1.0 / dt
        h2q0, h2q1, h2q2, h2q3, h2q4 = self.two_q
        ruu0 = 2.0 * self.r[0] + mu
        ruu1 = 2.0 * self.r[1] + mu
        # Value function: s (twice the constant part), p (gradient), V (Hessian, upper triangle).
        p0, p1, p2, p3, p4 = gx[-1]
        V00, V11, V22, V33, V44 = self.two_q_last
        V01 = V02 = V03 = V04 = V12 = V13 = V14 = V23 = V24 = V34 = 0.0
        s = 0.0
        step = 0.0
        check = 0.0
        gains = [None] * self.h
        try:
            for k in range(self.h - 1, -1, -1):
                a02, a12, a03, a13, a23, a04, a14, a24, b00, b10, b20, b01, b11, b21 = jac[k]
                # Q = l + f^T V' terms, A = I + (a..), B = (b.., dt on v / delta).
                Qx0 = p0
                Qx1 = p1
                Qx2 = p2 + a02 * p0 + a12 * p1
                Qx3 = p3 + a03 * p0 + a13 * p1 + a23 * p2
                Qx4 = p4 + a04 * p0 + a14 * p1 + a24 * p2
                Qu0 = gu[k][0] + b00 * p0 + b10 * p1 + b20 * p2 + dt * p3
                Qu1 = gu[k][1] + b01 * p0 + b11 * p1 + b21 * p2 + dt * p4
                # W = V A (columns 2..4; columns 0, 1 are V's).
                W02 = V02 + a02 * V00 + a12 * V01
                W12 = V12 + a02 * V01 + a12 * V11
                W22 = V22 + a02 * V02 + a12 * V12
                W03 = V03 + a03 * V00 + a13 * V01 + a23 * V02
                W13 = V13 + a03 * V01 + a13 * V11 + a23 * V12
                W23 = V23 + a03 * V02 + a13 * V12 + a23 * V22
                W33 = V33 + a03 * V03 + a13 * V13 + a23 * V23
                W04 = V04 + a04 * V00 + a14 * V01 + a24 * V02
                W14 = V14 + a04 * V01 + a14 * V11 + a24 * V12
                W24 = V24 + a04 * V02 + a14 * V12 + a24 * V22
                W34 = V34 + a04 * V03 + a14 * V13 + a24 * V23
                W44 = V44 + a04 * V04 + a14 * V14 + a24 * V24
                # Qxx = A^T V A (upper triangle).
                X00, X01, X02, X03, X04 = V00, V01, W02, W03, W04
                X11, X12, X13, X14 = V11, W12, W13, W14
                X22 = W22 + a02 * W02 + a12 * W12
                X23 = W23 + a02 * W03 + a12 * W13
                X24 = W24 + a02 * W04 + a12 * W14
                X33 = W33 + a03 * W03 + a13 * W13 + a23 * W23
                X34 = W34 + a03 * W04 + a13 * W14 + a23 * W24
                X44 = W44 + a04 * W04 + a14 * W14 + a24 * W24
                if k > 0:  # state cost of x_k
                    l0, l1, l2, l3, l4 = gx[k - 1]
                    Qx0 += l0
                    Qx1 += l1
                    Qx2 += l2
                    Qx3 += l3
                    Qx4 += l4
                    X00 += h2q0
                    X11 += h2q1
                    X22 += h2q2
                    X33 += h2q3
                    X44 += h2q4
                # Y = V B.
                Y00 = V00 * b00 + V01 * b10 + V02 * b20 + V03 * dt
                Y10 = V01 * b00 + V11 * b10 + V12 * b20 + V13 * dt
                Y20 = V02 * b00 + V12 * b10 + V22 * b20 + V23 * dt
                Y30 = V03 * b00 + V13 * b10 + V23 * b20 + V33 * dt
                Y40 = V04 * b00 + V14 * b10 + V24 * b20 + V34 * dt
                Y01 = V00 * b01 + V01 * b11 + V02 * b21 + V04 * dt
                Y11 = V01 * b01 + V11 * b11 + V12 * b21 + V14 * dt
                Y21 = V02 * b01 + V12 * b11 + V22 * b21 + V24 * dt
                Y31 = V03 * b01 + V13 * b11 + V23 * b21 + V34 * dt
                Y41 = V04 * b01 + V14 * b11 + V24 * b21 + V44 * dt
                Quu00 = b00 * Y00 + b10 * Y10 + b20 * Y20 + dt * Y30 + ruu0
                Quu01 = b00 * Y01 + b10 * Y11 + b20 * Y21 + dt * Y31
                Quu11 = b01 * Y01 + b11 * Y11 + b21 * Y21 + dt * Y41 + ruu1
                # Qux = B^T V A.
                U00, U01 = Y00, Y10
                U02 = Y20 + a02 * Y00 + a12 * Y10
                U03 = Y30 + a03 * Y00 + a13 * Y10 + a23 * Y20
                U04 = Y40 + a04 * Y00 + a14 * Y10 + a24 * Y20
                U10, U11 = Y01, Y11
                U12 = Y21 + a02 * Y01 + a12 * Y11
                U13 = Y31 + a03 * Y01 + a13 * Y11 + a23 * Y21
                U14 = Y41 + a04 * Y01 + a14 * Y11 + a24 * Y21
                f0, f1 = flags[k]
                fix0 = fix1 = False
                if f0 or f1:  # held inputs: on a bound with Q_u pushing out; see the module docstring
                    c0 = c1 = 0.0
                    if (f0 & 2 and Qu0 < 0.0) or (f0 & 1 and Qu0 > 0.0):
                        fix0 = True
                        if f0 & (8 if Qu0 < 0.0 else 4):
                            c0 = -inv_dt
                    if (f1 & 2 and Qu1 < 0.0) or (f1 & 1 and Qu1 > 0.0):
                        fix1 = True
                        if f1 & (8 if Qu1 < 0.0 else 4):
                            c1 = -inv_dt
                    if c0 or c1:  # substitute du = du' + Kc dx, Kc = diag rows (c0 on v, c1 on delta)
                        X03 += c0 * U00
                        X13 += c0 * U01
                        X23 += c0 * U02
                        X33 += c0 * (2.0 * U03 + c0 * Quu00)
                        X04 += c1 * U10
                        X14 += c1 * U11
                        X24 += c1 * U12
                        X34 += c0 * U04 + c1 * U13 + c0 * c1 * Quu01
                        X44 += c1 * (2.0 * U14 + c1 * Quu11)
                        Qx3 += c0 * Qu0
                        Qx4 += c1 * Qu1
                        U03 += Quu00 * c0
                        U13 += Quu01 * c0
                        U04 += Quu01 * c1
                        U14 += Quu11 * c1
                if not (fix0 or fix1):
                    inv = 1.0 / (Quu00 * Quu11 - Quu01 * Quu01)
                    k0 = (Quu01 * Qu1 - Quu11 * Qu0) * inv
                    k1 = (Quu01 * Qu0 - Quu00 * Qu1) * inv
                    K00 = (Quu01 * U10 - Quu11 * U00) * inv
                    K01 = (Quu01 * U11 - Quu11 * U01) * inv
                    K02 = (Quu01 * U12 - Quu11 * U02) * inv
                    K03 = (Quu01 * U13 - Quu11 * U03) * inv
                    K04 = (Quu01 * U14 - Quu11 * U04) * inv
                    K10 = (Quu01 * U00 - Quu00 * U10) * inv
                    K11 = (Quu01 * U01 - Quu00 * U11) * inv
                    K12 = (Quu01 * U02 - Quu00 * U12) * inv
                    K13 = (Quu01 * U03 - Quu00 * U13) * inv
                    K14 = (Quu01 * U04 - Quu00 * U14) * inv
                else:  # a held input has zero gains; the other is solved alone
                    k0 = k1 = K00 = K01 = K02 = K03 = K04 = K10 = K11 = K12 = K13 = K14 = 0.0
                    if not fix0:
                        inv = 1.0 / Quu00
                        k0, K00, K01, K02, K03, K04 = (-g * inv for g in (Qu0, U00, U01, U02, U03, U04))
                    elif not fix1:
                        inv = 1.0 / Quu11
                        k1, K10, K11, K12, K13, K14 = (-g * inv for g in (Qu1, U10, U11, U12, U13, U14))
                # Value update: V = Qxx + Qux^T K, p = Qx + Qux^T k, s += Qu^T k.
                V00 = X00 + U00 * K00 + U10 * K10
                V01 = X01 + U00 * K01 + U10 * K11
                V02 = X02 + U00 * K02 + U10 * K12
                V03 = X03 + U00 * K03 + U10 * K13
                V04 = X04 + U00 * K04 + U10 * K14
                V11 = X11 + U01 * K01 + U11 * K11
                V12 = X12 + U01 * K02 + U11 * K12
                V13 = X13 + U01 * K03 + U11 * K13
                V14 = X14 + U01 * K04 + U11 * K14
                V22 = X22 + U02 * K02 + U12 * K12
                V23 = X23 + U02 * K03 + U12 * K13
                V24 = X24 + U02 * K04 + U12 * K14
                V33 = X33 + U03 * K03 + U13 * K13
                V34 = X34 + U03 * K04 + U13 * K14
                V44 = X44 + U04 * K04 + U14 * K14
                p0 = Qx0 + U00 * k0 + U10 * k1
                p1 = Qx1 + U01 * k0 + U11 * k1
                p2 = Qx2 + U02 * k0 + U12 * k1
                p3 = Qx3 + U03 * k0 + U13 * k1
                p4 = Qx4 + U04 * k0 + U14 * k1
                s += Qu0 * k0 + Qu1 * k1
                if fix0 or fix1:
                    K03 += c0
                    K14 += c1
                n0, n1, n2, n3, n4 = xs[k]
                gains[k] = (
                    k0, k1,
                    K00 * n0 + K01 * n1 + K02 * n2 + K03 * n3 + K04 * n4,
                    K10 * n0 + K11 * n1 + K12 * n2 + K13 * n3 + K14 * n4,
                    K00, K01, K02, K03, K04, K10, K11, K12, K13, K14,
                )  # fmt: skip
                a0, a1 = abs(k0), abs(k1)
                if a0 > step:
                    step = a0
                if a1 > step:
                    step = a1
                check += K00 + K01 + K02 + K03 + K04 + K10 + K11 + K12 + K13 + K14 + k0 + k1
        except ZeroDivisionError:
            return None
        if not (math.isfinite(check) and math.isfinite(s)):
            return None
        return gains, -0.5 * s, step


def ilqr_solve(
    x0: np.ndarray,
    ref: np.ndarray,
    u_init: np.ndarray,
    vehicle: VehicleParams,
    dt: float,
    weights: CostWeights,
    settings: ILQRSettings,
    max_iterations: int | None = None,
    kernel: str = "auto",
) -> tuple[np.ndarray, np.ndarray, SolveReport]:
    """Solve B tracking problems. x0 [B, 5], ref [B, H, 5], u_init [B, H, 2].

    Returns (controls [B, H, 2], states [B, H+1, 5], report). The returned controls are the applied
    (projected) inputs, so re-rolling them out with ``bicycle.rollout`` gives ``states`` exactly.
    ``kernel``: "auto" (per-problem kernel up to ``SMALL_BATCH`` problems, else batched), "numpy"
    or "small" (forced; for tests and benchmarks).
    """
    if kernel not in _KERNELS:
        raise ValueError(f"kernel must be one of {_KERNELS}, got {kernel!r}")
    start = time.perf_counter()
    x0 = np.ascontiguousarray(x0, dtype=np.float64)
    ref = np.ascontiguousarray(ref, dtype=np.float64)
    u_init = np.asarray(u_init, dtype=np.float64)
    prob = _Problem(x0, ref, vehicle, dt, weights)
    b = prob.b
    iters_cap = settings.max_iterations if max_iterations is None else int(max_iterations)
    small = kernel == "small" or (kernel == "auto" and b <= SMALL_BATCH)
    kern = (_SmallKernel if small else _BatchKernel)(prob, u_init, settings.alphas)
    cost = kern.cost
    initial_cost = cost.copy()
    mu = np.full(b, settings.reg_init)
    iterations = np.zeros(b, dtype=np.int64)
    converged = np.zeros(b, dtype=bool)
    active = np.ones(b, dtype=bool)
    for _ in range(iters_cap):
        predicted, step, bad = kern.backward(mu, active)
        tol = settings.rel_tolerance * np.maximum(cost, 1e-12)
        search = active & ~bad  # a sweep that is not finite counts as a rejected step
        # Stationary already: the local model promises (almost) nothing, so skip the rollout.
        done_now = search & ((step < settings.step_tolerance) | (predicted < tol))
        if done_now.any():
            converged |= done_now
            iterations += done_now
            active &= ~done_now
            search &= ~done_now
            if not active.any():
                break
        new_cost = kern.line_search(search, cost)
        accept = search & (new_cost < cost)
        iterations += active
        if accept.any():
            kern.accept(accept)
            small_gain = accept & ((cost - new_cost) < tol)
            cost = np.where(accept, new_cost, cost)
            converged |= small_gain
            active &= ~small_gain
        grown = np.maximum(mu, settings.reg_min) * settings.reg_increase
        mu = np.where(accept, mu * settings.reg_decrease, np.where(active, grown, mu))
        mu = np.where(mu < settings.reg_min, 0.0, mu)
        active &= mu <= settings.reg_max
        if not active.any():
            break
    xs, us = kern.trajectories()
    report = SolveReport(
        iterations=iterations,
        initial_cost=initial_cost,
        final_cost=cost,
        converged=converged,
        regularization=mu,
        solve_time_ms=(time.perf_counter() - start) * 1e3,
        extra={"kernel": kern.name},
    )
    return us, xs, report
