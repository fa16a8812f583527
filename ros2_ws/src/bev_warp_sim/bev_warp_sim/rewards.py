"""Rollout rewards: RAD-2's safety and efficiency rewards (Eq. 13, 14) and Plan-R1's rule-based reward.

- ``r_coll = min_t (T_t − T_max)`` over the rollout (≤ 0; 0 when T_t never dropped below T_max).
- Ego progress ``ρ``: the ego's arc-length progress along the route polyline over the rollout window
  divided by the expert's (the log's) progress over the same window; 1 when the expert moved less than
  ``rewards.min_expert_progress_m`` (nothing to compare against).
- ``r_eff = min(ρ − ρ_low, 0) + min(ρ_high − ρ, 0) + 1`` with the window ``[ρ_low, ρ_high]`` from params.
- Plan-R1 (its Appendix C, nuPlan thresholds): ``R = Π gates × Σ w_j r_j / Σ w_j`` with the gates no
  collision, drivable area (box corners or centre inside the drivable polygons) and driving direction
  (nuPlan: the largest backwards progress along the route within a ``direction_window_s`` window;
  below ``direction_ok_m`` → 1, below ``direction_bad_m`` → 0.5, else 0), and the soft terms comfort
  (0/1 from the nuPlan comfort thresholds), TTC (1 when min T_t ≥ ``ttc_threshold_s``), speed-limit
  compliance (``max(0, 1 − ∫ overspeed dt / (max_overspeed · duration))``, the nuPlan form) and
  progress (``min(ρ, 1)``).
"""

from __future__ import annotations

from typing import Any

import numpy as np


class RoutePath:
    """Arc-length projection onto a polyline (the clip's route)."""

    def __init__(self, polyline):
        pts = np.asarray(polyline, dtype=np.float64)
        if pts.ndim != 2 or pts.shape[1] != 2 or len(pts) < 2:
            raise ValueError(f"route_polyline: expected [P >= 2, 2] points, got shape {pts.shape}")
        seg = np.diff(pts, axis=0)
        seg_len = np.hypot(seg[:, 0], seg[:, 1])
        keep = np.concatenate([[True], seg_len > 1e-9])
        pts = pts[keep]
        if len(pts) < 2:
            raise ValueError("route_polyline: all points coincide")
        self.points = pts
        self.seg = np.diff(pts, axis=0)
        self.seg_len = np.hypot(self.seg[:, 0], self.seg[:, 1])
        self.s0 = np.concatenate([[0.0], np.cumsum(self.seg_len)])
        self.length = float(self.s0[-1])
        self.heading = np.arctan2(self.seg[:, 1], self.seg[:, 0])

    def project(self, xy) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``xy [..., 2]`` -> (arc length s, signed lateral offset (left +), segment heading), each ``[...]``.

        Points before the start or past the end extrapolate along the first/last segment.
        """
        xy = np.asarray(xy, dtype=np.float64)
        p = xy[..., None, :] - self.points[:-1]  # [..., S, 2]
        u = np.sum(p * self.seg, -1) / self.seg_len**2
        n_seg = len(self.seg_len)
        lo = np.zeros(n_seg)
        hi = np.ones(n_seg)
        lo[0], hi[-1] = -np.inf, np.inf
        uc = np.clip(u, lo, hi)
        proj = self.points[:-1] + uc[..., None] * self.seg
        d2 = np.sum((xy[..., None, :] - proj) ** 2, -1)
        k = np.argmin(d2, axis=-1)
        u_k = np.take_along_axis(uc, k[..., None], -1)[..., 0]
        s = self.s0[k] + u_k * self.seg_len[k]
        seg_k = self.seg[k]
        rel = xy - self.points[k]
        lat = (seg_k[..., 0] * rel[..., 1] - seg_k[..., 1] * rel[..., 0]) / self.seg_len[k]
        return s, lat, self.heading[k]


def r_coll(ttc_series, t_max: float) -> float:
    """RAD-2 Eq. 13: the worst temporal margin ``min_t (T_t − T_max)`` (0 for an empty rollout)."""
    ttc = np.asarray(ttc_series, dtype=np.float64)
    if ttc.size == 0:
        return 0.0
    return float(np.min(ttc) - t_max)


def progress_ratio(ego_progress_m: float, expert_progress_m: float, min_expert_progress_m: float) -> float:
    """Ego progress ρ relative to the expert over the same window (1 when the expert barely moved)."""
    if expert_progress_m < min_expert_progress_m:
        return 1.0
    return float(ego_progress_m / expert_progress_m)


def r_eff(rho: float, rho_low: float, rho_high: float) -> float:
    """RAD-2 Eq. 14: ``min(ρ − ρ_low, 0) + min(ρ_high − ρ, 0) + 1``."""
    if rho_low > rho_high:
        raise ValueError(f"rewards.rho_low: {rho_low} exceeds rho_high {rho_high}")
    return float(min(rho - rho_low, 0.0) + min(rho_high - rho, 0.0) + 1.0)


# ----------------------------------------------------------------------------------------------------
# Comfort (shared with metrics)

COMFORT_TERMS = ("lon_accel", "lat_accel", "yaw_rate", "yaw_accel", "lon_jerk", "jerk")


def comfort_signals(poses, speeds, dt: float) -> dict[str, np.ndarray]:
    """Kinematic signals of a driven path: poses ``[T, 3]``, speeds ``[T]`` -> dict of ``[T]`` arrays."""
    poses = np.asarray(poses, dtype=np.float64)
    v = np.asarray(speeds, dtype=np.float64)
    t = len(v)
    if t < 3:
        zeros = np.zeros(t)
        return {k: zeros.copy() for k in COMFORT_TERMS}
    yaw = np.unwrap(poses[:, 2])
    yaw_rate = np.gradient(yaw, dt)
    yaw_accel = np.gradient(yaw_rate, dt)
    lon_accel = np.gradient(v, dt)
    lat_accel = v * yaw_rate
    lon_jerk = np.gradient(lon_accel, dt)
    lat_jerk = np.gradient(lat_accel, dt)
    return {
        "lon_accel": lon_accel,
        "lat_accel": lat_accel,
        "yaw_rate": yaw_rate,
        "yaw_accel": yaw_accel,
        "lon_jerk": lon_jerk,
        "jerk": np.hypot(lon_jerk, lat_jerk),
    }


def comfort_violations(signals: dict[str, np.ndarray], cfg: dict[str, Any]) -> dict[str, np.ndarray]:
    """Per-step bool violations of the nuPlan comfort thresholds (``comfort`` block of sim.yaml)."""
    return {
        "lon_accel": (signals["lon_accel"] > float(cfg["max_lon_accel"]))
        | (signals["lon_accel"] < float(cfg["min_lon_accel"])),
        "lat_accel": np.abs(signals["lat_accel"]) > float(cfg["max_abs_lat_accel"]),
        "yaw_rate": np.abs(signals["yaw_rate"]) > float(cfg["max_abs_yaw_rate"]),
        "yaw_accel": np.abs(signals["yaw_accel"]) > float(cfg["max_abs_yaw_accel"]),
        "lon_jerk": np.abs(signals["lon_jerk"]) > float(cfg["max_abs_lon_jerk"]),
        "jerk": np.abs(signals["jerk"]) > float(cfg["max_abs_jerk"]),
    }


# ----------------------------------------------------------------------------------------------------
# Plan-R1


def driving_direction_score(route_s, dt: float, cfg: dict[str, Any]) -> float:
    """nuPlan driving-direction compliance from the arc-length track ``route_s [T]``."""
    s = np.asarray(route_s, dtype=np.float64)
    if len(s) < 2:
        return 1.0
    w = max(1, int(round(float(cfg["direction_window_s"]) / dt)))
    worst = 0.0
    for k in range(1, len(s)):
        j0 = max(0, k - w)
        worst = max(worst, float(np.max(s[j0:k]) - s[k]))  # backwards motion within the window
    if worst < float(cfg["direction_ok_m"]):
        return 1.0
    if worst < float(cfg["direction_bad_m"]):
        return 0.5
    return 0.0


def speed_limit_score(speeds, speed_limits, dt: float, cfg: dict[str, Any]) -> float:
    """nuPlan speed-limit compliance: ``max(0, 1 − ∫ overspeed dt / (max_overspeed · duration))``."""
    v = np.asarray(speeds, dtype=np.float64)
    lim = np.asarray(speed_limits, dtype=np.float64)
    if len(v) == 0:
        return 1.0
    over = np.maximum(v - lim, 0.0)
    duration = max(len(v) * dt, dt)
    return float(max(0.0, 1.0 - over.sum() * dt / (float(cfg["max_overspeed_m_s"]) * duration)))


def plan_r1_reward(
    *,
    collided: bool,
    drivable_ok: bool,
    route_s,
    speeds,
    speed_limits,
    comfort_ok: bool,
    min_ttc: float,
    rho: float,
    dt: float,
    params: dict[str, Any],
) -> dict[str, float]:
    """Plan-R1 rule-based reward of one rollout; returns the total and every component."""
    cfg = params["rewards"]["plan_r1"]
    direction = driving_direction_score(route_s, dt, cfg)
    gates = (0.0 if collided else 1.0) * (1.0 if drivable_ok else 0.0) * direction
    terms = {
        "comfort": 1.0 if comfort_ok else 0.0,
        "ttc": 1.0 if min_ttc >= float(cfg["ttc_threshold_s"]) else 0.0,
        "speed_limit": speed_limit_score(speeds, speed_limits, dt, cfg),
        "progress": float(min(max(rho, 0.0), 1.0)),
    }
    weights = {
        "comfort": float(cfg["weight_comfort"]),
        "ttc": float(cfg["weight_ttc"]),
        "speed_limit": float(cfg["weight_speed_limit"]),
        "progress": float(cfg["weight_progress"]),
    }
    soft = sum(weights[k] * terms[k] for k in terms) / sum(weights.values())
    return {"total": float(gates * soft), "gates": float(gates), "direction": direction, **terms}
