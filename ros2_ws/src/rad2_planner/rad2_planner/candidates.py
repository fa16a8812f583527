"""Candidate maths of the planner: pure functions over one cycle's inputs and its M candidates.

- :func:`observation_inputs`: an Observation (object or dict, single or batched) as the scene
  encoder's input batch, checked against the model's shapes; :func:`correction_inputs`: rejected
  proposals as the correction encoder's input (the self-correcting generator).
- :func:`mean_pairwise_distance`, :func:`medoid_index`: the mode of a candidate set (the fallback
  selection ``medoid``); :func:`consensus_prior`: the standardised preference for it that
  ``planner.discriminator_prior_weight`` adds to the discriminator's logits.
- :func:`first_overlaps`, :func:`safe_candidates`, :func:`safe_medoid_index`: when a candidate's ego
  box first overlaps an observed agent extrapolated at constant velocity, the candidates that never
  do, and their medoid (``safe_medoid``, and the set of ``planner.discriminator_candidates: safe``).

NumPy and SciPy only; :class:`rad2_planner.policy.Rad2Policy` applies them with its settings.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from rad2_core.geometry import tracks_overlap
from rad2_core.observation import BOOL_FIELDS, FIELD_RANKS, ObservationError
from rad2_core.open_loop_metrics import plan_headings
from rad2_core.route_path import RoutePath

# at import, not in the first planning cycle: scipy.spatial's first import took 150-340 ms, the first
# cycle's selection stage of every planner start (a deadline miss at each start of make demo)
from scipy.spatial.distance import cdist

from rad2_planner.safety_envelope import constant_velocity_boxes

# Largest planner.discriminator_prior_weight (the schema's bound): beyond it the prior alone decides and
# the float32 logits lose the discriminator's differences, so a larger value is a typo, not a setting.
MAX_PRIOR_WEIGHT = 1000.0


def observation_inputs(observation: Any, cfg=None, observation_channels=None) -> dict[str, np.ndarray]:
    """An Observation (object or dict, single or batched) -> the scene-encoder input batch.

    With the model config ``cfg``: the model is fed the BEV channels it names (of ``observation_channels``,
    default ``bev.channels`` of params/bev.yaml) and its first ``map_point_dim`` map-token features, so a
    checkpoint trained before a channel or feature was added keeps working; then every field's shape is
    checked against ``cfg`` and the offending field named.
    """
    out = {}
    for name, unbatched_ndim in FIELD_RANKS.items():
        v = observation[name] if isinstance(observation, dict) else getattr(observation, name, None)
        if v is None:
            raise ObservationError(f"observation has no field {name!r}")
        a = np.asarray(v)
        if a.ndim == unbatched_ndim:
            a = a[None]
        elif a.ndim != unbatched_ndim + 1:
            raise ObservationError(
                f"observation.{name}: shape {a.shape} has {a.ndim} dims, expected "
                f"{unbatched_ndim} (or {unbatched_ndim + 1} batched)"
            )
        a = a.astype(bool if name in BOOL_FIELDS else np.float32, copy=False)
        if name not in BOOL_FIELDS and not np.all(np.isfinite(a)):
            raise ObservationError(f"observation.{name}: contains non-finite values")
        out[name] = np.ascontiguousarray(a)
    if cfg is not None:
        try:
            out = cfg.select_inputs(out, observation_channels)
        except ValueError as e:
            raise ObservationError(str(e)) from None
        expect = {
            "bev": (cfg.bev_channels, *cfg.bev_hw),
            "map_polylines": (cfg.n_map, cfg.map_points, cfg.map_point_dim),
            "map_mask": (cfg.n_map,),
            "agents": (cfg.n_agents, 10),
            "agents_mask": (cfg.n_agents,),
            "route": (cfg.n_route, 4),
            "route_mask": (cfg.n_route,),
            "ego_state": (4,),
        }
        b = out["bev"].shape[0]
        for name, shp in expect.items():
            if out[name].shape != (b, *shp):
                raise ObservationError(
                    f"observation.{name}: shape {out[name].shape[1:]} does not match the model's {shp}"
                )
    return out


def correction_inputs(traces: list[list[np.ndarray]], speeds, normalizer, trace_len: int, plan_points: int
                      ) -> tuple[np.ndarray, np.ndarray]:
    """Correction-encoder inputs of rows' rejected proposals (lists of ``[T, 2]`` ego-frame metres, oldest
    first): the newest ``trace_len`` of each, normalised like the generator's output at the row's speed,
    zero-padded, and the mask of the filled slots -> ``(trace [B, L, T, 2], mask [B, L])``."""
    trace = np.zeros((len(traces), trace_len, plan_points, 2), np.float32)
    mask = np.zeros((len(traces), trace_len), bool)
    for j, rejected in enumerate(traces):
        kept = list(rejected)[-trace_len:]
        if kept:
            trace[j, :len(kept)] = normalizer.normalize(np.stack(kept).astype(np.float32), float(speeds[j]))
            mask[j, :len(kept)] = True
    return trace, mask


def mean_pairwise_distance(candidates: np.ndarray, allowed: np.ndarray | None = None) -> np.ndarray:
    """``[M]``: each candidate's mean point-wise distance (m) to the ``allowed`` candidates ``[M]`` (bool;
    None: all), over every plan point. The medoid minimises it.

    One distance matrix per time step (scipy's cdist) rather than an [M, M, T, 2] difference array:
    0.4 instead of 4 ms at M = 128.
    """
    c = np.asarray(candidates, np.float64)
    others = c if allowed is None else c[np.asarray(allowed, bool)]
    if not len(others):
        raise ValueError("allowed: no candidate allowed (at least one must be)")
    total = np.zeros(len(c))
    for t in range(c.shape[1]):
        total += cdist(c[:, t], others[:, t]).sum(axis=1)
    return total / (len(others) * max(c.shape[1], 1))


def medoid_index(candidates: np.ndarray) -> int:
    """Index of the candidate [M, T, 2] with the smallest mean point-wise distance to the others."""
    return int(np.argmin(mean_pairwise_distance(candidates)))


def consensus_prior(candidates: np.ndarray, allowed: np.ndarray | None = None) -> np.ndarray:
    """``[M]`` log-preference of each candidate ``[M, T, 2]`` for the consensus of the ``allowed`` set:
    ``−(d_m − min d) / std d`` over the allowed candidates, with ``d`` the :func:`mean_pairwise_distance`
    to them (0 for the medoid and where not allowed: the draw never picks those; all 0 when the allowed
    candidates are equally far from each other).

    Added with a weight κ (``planner.discriminator_prior_weight``) to the discriminator's logits, it
    makes the selection distribution ``softmax(l + κ·prior)``: with a constant ``l`` (an untrained head)
    its argmax is the medoid of the allowed set (``safe_medoid`` with the safe set), so RL starts from
    the best hand-written rule and learns where to leave it instead of starting from a uniform choice.
    Standardised, so κ means the same in a tight and in a spread set.
    """
    mask = np.ones(len(candidates), bool) if allowed is None else np.asarray(allowed, bool)
    d = mean_pairwise_distance(candidates, mask)
    spread = float(d[mask].std())
    if spread <= 1e-9 * max(float(d[mask].max()), 1e-9):  # rounding noise, not a preference
        return np.zeros(len(d))
    return np.where(mask, -(d - d[mask].min()) / spread, 0.0)


def substep_poses(points: np.ndarray, yaw: np.ndarray, substeps: int) -> np.ndarray:
    """Poses ``[.., T·substeps, 3]`` (x, y, yaw) of plans ``points [.., T, 2]`` with headings ``yaw [.., T]``
    at ``substeps`` evenly spaced times per interval, the last of each interval its plan point: positions
    and headings linear from the previous point (the origin, heading 0, before the first)."""
    n = int(substeps)
    if n < 1:
        raise ValueError(f"substeps: must be an integer >= 1, got {substeps!r}")
    pose = np.concatenate([np.asarray(points, np.float64), np.asarray(yaw, np.float64)[..., None]], -1)
    if n == 1:
        return pose
    prev = np.concatenate([np.zeros_like(pose[..., :1, :]), pose[..., :-1, :]], axis=-2)
    step = pose - prev
    step[..., 2] = np.angle(np.exp(1j * step[..., 2]))  # the short way round
    frac = np.arange(1, n + 1) / n  # n
    fine = prev[..., :, None, :] + frac[:, None] * step[..., :, None, :]  # .. T n 3
    return fine.reshape(*pose.shape[:-2], pose.shape[-2] * n, 3)


def first_overlaps(
    candidates: np.ndarray, agents: np.ndarray, agents_mask: np.ndarray, plan_dt: float,
    ego_size: tuple[float, float], max_curvature: float, substeps: int = 1,
) -> np.ndarray:
    """Per candidate of ``[M, T, 2]`` (point k at (k+1)·plan_dt), the index of its first point whose ego
    box overlaps an observed agent extrapolated at constant velocity, looked at ``substeps`` times per
    interval (``planner.collision_time_step_s``; an overlap within interval k counts at point k); T where
    none does. Why substeps: a car crossing at 8 m/s moves 4 m in the plan's 0.5 s, about its length,
    and could pass through the ego's box between two plan points unseen."""
    m, t = candidates.shape[:2]
    a = agents[agents_mask.astype(bool)]
    if not len(a):
        return np.full(m, t)
    n = int(substeps)
    agent_boxes = constant_velocity_boxes(a, (np.arange(t * n) + 1.0) * (plan_dt / n))  # N T·n 5
    yaw = plan_headings(candidates, max_curvature=max_curvature)
    pose = substep_poses(candidates, yaw, n)  # M T·n 3
    ego = np.stack(np.broadcast_arrays(pose[..., 0], pose[..., 1], pose[..., 2], *ego_size), -1)
    hit = tracks_overlap(ego, agent_boxes)  # M T·n
    return np.where(hit.any(1), hit.argmax(1) // n, t)


def safe_candidates(
    candidates: np.ndarray, agents: np.ndarray, agents_mask: np.ndarray, plan_dt: float,
    ego_size: tuple[float, float], max_curvature: float, exit_times: np.ndarray | None = None,
    substeps: int = 1,
) -> np.ndarray:
    """Indices of the candidates ``[M, T, 2]`` whose ego box overlaps no observed agent extrapolated at
    constant velocity; when every candidate overlaps one, those whose first overlap comes latest (never
    empty). The safe set of ``safe_medoid`` and of ``planner.discriminator_candidates: safe``.

    ``exit_times`` ([M] s until each candidate's box leaves the BEV's drivable area, inf: never;
    :func:`rad2_planner.drivable_area.candidate_exit_times`, ``planner.selection_drivable``): of those,
    the ones that stay on the drivable area longest (all that stay on it, when any does)."""
    first = first_overlaps(candidates, agents, agents_mask, plan_dt, ego_size, max_curvature, substeps)
    keep = np.nonzero(first == first.max())[0]
    if exit_times is not None and len(keep) > 1:
        stay = np.asarray(exit_times, np.float64)[keep]
        keep = keep[stay == stay.max()]
    return keep


def safe_medoid_index(
    candidates: np.ndarray, agents: np.ndarray, agents_mask: np.ndarray, plan_dt: float,
    ego_size: tuple[float, float], max_curvature: float, route: np.ndarray | None = None,
    progress_quantile: float = 0.0, exit_times: np.ndarray | None = None, substeps: int = 1,
) -> int:
    """Medoid of the candidates that avoid the constant-velocity extrapolation of the observed agents.

    ``agents [N, 10]`` are observation agent tokens (x, y, cos, sin, vx, vy, length, width, ...), ego
    frame. Candidates overlapping an agent are dropped; if none is left, those whose first overlap is
    latest are kept; with ``exit_times``, of those the ones that stay on the drivable area longest
    (:func:`safe_candidates`).

    ``progress_quantile`` q in [0, 1) (``planner.selection_progress_quantile``): of the safe candidates,
    only those whose end point gets at least as far along ``route`` (``[P >= 2, 2]`` ego-frame points,
    :func:`rad2_core.route_path.observation_route`) as the q-quantile of them are kept before the
    medoid is taken. Why: the generator's samples spread around a mode that is slower than the logged
    drivers (it imitates their average, and more so where it is unsure, e.g. before a sharp turn), and
    the medoid of the whole set sits at that mode; q = 0 keeps every safe candidate. Progress is
    counted up to the route's last point only.
    """
    keep = safe_candidates(candidates, agents, agents_mask, plan_dt, ego_size, max_curvature, exit_times,
                           substeps)
    if progress_quantile > 0.0 and route is not None and len(keep) > 1:
        path = RoutePath(route)
        # past the route's last point there is nothing to gain (RoutePath extrapolates beyond it)
        end = np.minimum(path.project(candidates[keep, -1].astype(np.float64))[0], path.length)
        progress = end - path.project(np.zeros(2))[0]
        keep = keep[progress >= np.quantile(progress, progress_quantile)]
    return int(keep[medoid_index(candidates[keep])])
