"""Arc-length geometry of a route polyline, and the route as a planner observation carries it (no ROS).

One implementation for everything that measures along a route: the simulator's progress and EP
(``bev_warp_sim``), the IDM reference policy, and the planner's route-aware candidate selection
(:func:`rad2_planner.candidates.safe_medoid_index`).

:func:`check_route` is the one validity check of a clip's route: dataset conversion refuses a clip
that fails it and the simulator refuses to drive one, with the same reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from rad2_core.field_checks import ClipValidationError


def observation_route(route_tokens, route_mask) -> np.ndarray:
    """The valid route points ``[P >= 2, 2]`` of an observation (ego frame), starting at the ego.

    The route tokens begin at the ego's projection onto the route; when the first valid point lies
    ahead of the ego (or there is none), the ego's position is prepended, and a route of one point is
    continued straight ahead, so the result always makes a :class:`RoutePath`.
    """
    pts = np.asarray(route_tokens, dtype=np.float64)[np.asarray(route_mask, bool)][:, :2]
    if len(pts) == 0 or pts[0, 0] > 0.5:
        pts = np.concatenate([np.zeros((1, 2)), pts]) if len(pts) else np.array([[0.0, 0.0], [1.0, 0.0]])
    if len(pts) < 2:
        pts = np.concatenate([pts, pts[-1:] + [[1.0, 0.0]]])
    return pts


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

    def reversal(self, max_turn_deg: float) -> str | None:
        """Where the route doubles back (its heading turns by more than ``max_turn_deg`` between two
        segments), or None. Progress measured along such a route counts the same stretch twice (or
        jumps), so EP refuses it; real routes turn at most about 90 degrees at a junction corner."""
        turn = np.abs(np.angle(np.exp(1j * np.diff(self.heading))))
        bad = np.flatnonzero(turn > np.deg2rad(max_turn_deg))
        if not len(bad):
            return None
        k = int(bad[0]) + 1
        x, y = self.points[k]
        return (f"route_polyline: doubles back at point {k} ({x:.1f}, {y:.1f}), arc length "
                f"{self.s0[k]:.1f} m: the heading turns {np.rad2deg(turn[k - 1]):.0f} deg > "
                f"metrics.route_max_turn_deg {max_turn_deg:g}")

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


class RouteError(ClipValidationError):
    """A route along which progress cannot be measured (a clip with it is invalid, so readers that skip
    invalid clips skip it). ``reason`` is a short key for counting refusals (one of
    :data:`ROUTE_REFUSALS`); the message says where and by how much."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


# reason keys of RouteError
ROUTE_REFUSALS = ("malformed", "doubles_back", "off_route", "runs_backward")


@dataclass(frozen=True)
class RouteLimits:
    """What a route must satisfy (params/sim.yaml ``metrics.route_*``)."""

    max_turn_deg: float  # heading change between two segments; more doubles back
    max_offset_m: float  # the logged ego may be this far from the route at most
    max_backtrack_m: float  # the logged ego's projection may fall back this far below its best so far

    @classmethod
    def from_params(cls, sim_params: dict[str, Any]) -> RouteLimits:
        """From params/sim.yaml as :func:`rad2_core.config.load_params` gives it (or its ``metrics``)."""
        m = sim_params.get("metrics", sim_params)
        try:
            return cls(float(m["route_max_turn_deg"]), float(m["route_max_offset_m"]),
                       float(m["route_max_backtrack_m"]))
        except KeyError as exc:
            raise KeyError(f"params/sim.yaml: metrics.{exc.args[0]} is missing (route limits)") from None


def check_route(polyline, ego_xy, limits: RouteLimits) -> RoutePath:
    """The :class:`RoutePath` of ``polyline`` when progress can be measured along it, else
    :class:`RouteError` naming the reason and the place.

    - ``malformed``: fewer than two distinct points or non-finite values;
    - ``doubles_back``: the heading turns by more than ``limits.max_turn_deg`` between two segments
      (progress would count a stretch twice, or jump);
    - with the logged ego path ``ego_xy [T, 2]``: ``off_route``: a logged pose lies farther than
      ``limits.max_offset_m`` from the route (the route does not follow the driver: the expert's
      progress, EP's denominator, would stall or leap there); ``runs_backward``: the logged ego's
      projection falls more than ``limits.max_backtrack_m`` below the farthest it had reached (the
      route runs against the driver somewhere).

    ``limits``: :meth:`RouteLimits.from_params` of params/sim.yaml (``ego_xy`` None: no logged path).
    """
    pts = np.asarray(polyline, dtype=np.float64)
    if pts.ndim != 2 or pts.shape[-1] != 2 or not np.all(np.isfinite(pts)):
        raise RouteError("malformed",
                         f"route_polyline: expected finite [P >= 2, 2] points, got shape {pts.shape}")
    try:
        route = RoutePath(pts)
    except ValueError as exc:
        raise RouteError("malformed", str(exc)) from None
    doubled = route.reversal(limits.max_turn_deg)
    if doubled:
        raise RouteError("doubles_back", doubled)
    if ego_xy is None:
        return route
    xy = np.asarray(ego_xy, dtype=np.float64).reshape(-1, 2)
    if not len(xy):
        return route
    s, lat, _ = route.project(xy)
    # a pose before the route's start or past its end counts as following it when it lies on the
    # straight continuation (progress extrapolates there too), so only the lateral offset is limited
    far = np.flatnonzero(np.abs(lat) > limits.max_offset_m)
    if len(far):
        t = int(far[0])
        raise RouteError("off_route", f"route_polyline: the logged ego at step {t} ({xy[t, 0]:.1f}, "
                                      f"{xy[t, 1]:.1f}) is {abs(lat[t]):.1f} m from the route > "
                                      f"metrics.route_max_offset_m {limits.max_offset_m:g}")
    best = np.maximum.accumulate(s)
    back = best - s
    bad = np.flatnonzero(back > limits.max_backtrack_m)
    if len(bad):
        t = int(bad[0])
        raise RouteError("runs_backward",
                         f"route_polyline: the logged ego's progress along the route falls back "
                         f"{back[t]:.1f} m at step {t} ({xy[t, 0]:.1f}, {xy[t, 1]:.1f}) > "
                         f"metrics.route_max_backtrack_m {limits.max_backtrack_m:g}")
    return route
