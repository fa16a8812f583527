"""What the planner sees at one time: the BEV raster plus token tensors, all ego frame, float32.

Fields and shapes (``docs/conventions.md``); a batch adds one leading dimension to every field:

| field | shape | dtype |
| --- | --- | --- |
| bev | [C, H, W] | float32 |
| map_polylines | [N_map, P, 8] | float32 |
| map_mask | [N_map] | bool |
| agents | [N_agents, 10] | float32 |
| agents_mask | [N_agents] | bool |
| route | [N_route, 4] | float32 |
| route_mask | [N_route] | bool |
| ego_state | [4] | float32 |
| signal_stop | [2] | float32 |

``signal_stop`` is not a network input: (distance along the route from the ego's centre to the nearest
red/yellow stop line ahead, that state), (stop_lines.NO_STOP_M, 0) when none; the planner's rule
layer (``rad2_planner.traffic_rules``) keeps the executed plan behind it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from rad2_core.bev import SceneSnapshot, get_config, rasterize_bev
from rad2_core.tokens import (
    AGENT_FEATURES,
    MAP_FEATURES,
    ROUTE_FEATURES,
    agent_tokens,
    get_token_config,
    map_tokens,
    route_tokens,
)


def no_signal_stop() -> np.ndarray:
    from rad2_core.stop_lines import NO_STOP_M

    return np.array([NO_STOP_M, 0.0], np.float32)


class ObservationError(ValueError):
    """An observation's fields are inconsistent, or do not match the sizes the networks were built for
    (the message names the field and shape)."""


_FLOAT_FIELDS = ("bev", "map_polylines", "agents", "route", "ego_state")
BOOL_FIELDS = ("map_mask", "agents_mask", "route_mask")
# unbatched rank of each field (also what :func:`rad2_planner.candidates.observation_inputs` checks)
FIELD_RANKS = {
    "bev": 3,
    "map_polylines": 3,
    "map_mask": 1,
    "agents": 2,
    "agents_mask": 1,
    "route": 2,
    "route_mask": 1,
    "ego_state": 1,
}


@dataclass
class Observation:
    bev: np.ndarray
    map_polylines: np.ndarray
    map_mask: np.ndarray
    agents: np.ndarray
    agents_mask: np.ndarray
    route: np.ndarray
    route_mask: np.ndarray
    ego_state: np.ndarray
    signal_stop: np.ndarray = field(default_factory=lambda: no_signal_stop())

    @property
    def batch_shape(self) -> tuple[int, ...]:
        """() for a single observation, (B,) for a batch."""
        return tuple(self.ego_state.shape[:-1])

    @property
    def is_batched(self) -> bool:
        return len(self.batch_shape) > 0

    def __len__(self) -> int:
        if not self.is_batched:
            raise TypeError("len() of an unbatched Observation")
        return int(self.batch_shape[0])

    def __getitem__(self, index) -> Observation:
        if not self.is_batched:
            raise TypeError("indexing an unbatched Observation")
        return Observation(**{f.name: getattr(self, f.name)[index] for f in fields(self)})

    def as_dict(self) -> dict[str, np.ndarray]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def copy(self) -> Observation:
        return Observation(**{k: v.copy() for k, v in self.as_dict().items()})

    def validate(self, params: dict[str, Any] | None = None) -> Observation:
        """Check dtypes and mutual shape consistency (and, with ``params``, the configured sizes)."""
        for name in _FLOAT_FIELDS + BOOL_FIELDS:
            v = getattr(self, name)
            if not isinstance(v, np.ndarray):
                raise ObservationError(f"{name}: expected a numpy array, got {type(v).__name__}")
            want = np.float32 if name in _FLOAT_FIELDS else np.bool_
            if v.dtype != want:
                raise ObservationError(f"{name}: dtype {v.dtype} is not {np.dtype(want)}")
        b = self.batch_shape
        nb = len(b)
        if nb > 1:
            raise ObservationError(
                f"ego_state: shape {self.ego_state.shape} has more than one batch dimension"
            )
        for name, rank in FIELD_RANKS.items():
            v = getattr(self, name)
            if v.ndim != rank + nb or tuple(v.shape[:nb]) != b:
                raise ObservationError(
                    f"{name}: shape {v.shape} does not have rank {rank} after batch shape {b}"
                )
        sh = {n: getattr(self, n).shape[nb:] for n in FIELD_RANKS}
        if sh["ego_state"] != (4,):
            raise ObservationError(
                f"ego_state: shape {self.ego_state.shape} is not (4,) after batch shape {b}"
            )
        checks = [
            ("map_polylines", sh["map_polylines"][2] == MAP_FEATURES, f"[N_map, P, {MAP_FEATURES}]"),
            ("map_mask", sh["map_mask"] == sh["map_polylines"][:1], f"[N_map={sh['map_polylines'][0]}]"),
            ("agents", sh["agents"][1] == AGENT_FEATURES, f"[N_agents, {AGENT_FEATURES}]"),
            ("agents_mask", sh["agents_mask"] == sh["agents"][:1], f"[N_agents={sh['agents'][0]}]"),
            ("route", sh["route"][1] == ROUTE_FEATURES, f"[N_route, {ROUTE_FEATURES}]"),
            ("route_mask", sh["route_mask"] == sh["route"][:1], f"[N_route={sh['route'][0]}]"),
        ]
        for name, ok, want in checks:
            if not ok:
                raise ObservationError(f"{name}: shape {getattr(self, name).shape} does not match {want}")
        if params is not None:
            cfg, tcfg = get_config(params), get_token_config(params)
            want = {
                "bev": cfg.shape,
                "map_polylines": (tcfg.n_map, tcfg.points, MAP_FEATURES),
                "agents": (tcfg.n_agents, AGENT_FEATURES),
                "route": (tcfg.n_route, ROUTE_FEATURES),
            }
            for name, shape in want.items():
                if tuple(sh[name]) != tuple(shape):
                    raise ObservationError(
                        f"{name}: shape {getattr(self, name).shape} does not match "
                        f"the configured {shape} (params/bev.yaml)"
                    )
        for name in _FLOAT_FIELDS:
            if not np.all(np.isfinite(getattr(self, name))):
                raise ObservationError(f"{name}: contains non-finite values")
        ss = np.asarray(self.signal_stop)
        if ss.shape != b + (2,) or not np.all(np.isfinite(ss)):
            raise ObservationError(f"signal_stop: expected finite shape {b + (2,)}, got {ss.shape}")
        return self


def stack_observations(observations: list[Observation]) -> Observation:
    """Batch unbatched observations along a new leading axis."""
    if not observations:
        raise ObservationError("observations: cannot stack an empty list")
    for i, o in enumerate(observations):
        if o.is_batched:
            raise ObservationError(f"observations[{i}]: already batched (batch shape {o.batch_shape})")
    out = {}
    for f in fields(Observation):
        shapes = {getattr(o, f.name).shape for o in observations}
        if len(shapes) != 1:
            raise ObservationError(f"{f.name}: observations have different shapes {sorted(shapes)}")
        out[f.name] = np.stack([getattr(o, f.name) for o in observations])
    return Observation(**out)


def build_observation(
    snapshot: SceneSnapshot, ego_pose=None, ego_state=None, *, params: dict[str, Any]
) -> Observation:
    """BEV + tokens of ``snapshot`` in the ego frame of ``ego_pose`` (default: the snapshot's);
    ``params``: params/bev.yaml as loaded."""
    pose = np.asarray(snapshot.ego_pose if ego_pose is None else ego_pose, np.float64)
    bev = rasterize_bev(snapshot, ego_pose=pose, params=params)
    tcfg = get_token_config(params)
    mp, mm = map_tokens(snapshot.map, pose, snapshot.route_lane_ids, snapshot.route_polyline, params=tcfg,
                        signal_states=snapshot.signal_states)
    ag, am = agent_tokens(snapshot.agents, pose, tcfg)
    rt, rm = route_tokens(snapshot.route_polyline, pose, tcfg)
    es = np.asarray(snapshot.ego_state if ego_state is None else ego_state, np.float64)
    if es.shape != (4,):
        raise ObservationError(f"ego_state: shape {es.shape} is not (4,)")
    from rad2_core.stop_lines import next_signal_stop

    return Observation(
        signal_stop=next_signal_stop(snapshot.map, snapshot.signal_states, snapshot.route_lane_ids,
                                     snapshot.route_polyline, pose, snapshot.ego_length),
        bev=bev,
        map_polylines=mp,
        map_mask=mm,
        agents=ag,
        agents_mask=am,
        route=rt,
        route_mask=rm,
        ego_state=es.astype(np.float32),
    )


def _apply_se2(xy: np.ndarray, cs: np.ndarray, c, s, dx, dy):
    """Points and directions of frame A re-expressed in frame B = A o delta (delta=(dx,dy,yaw))."""
    px, py = xy[..., 0] - dx, xy[..., 1] - dy
    new_xy = np.stack([c * px + s * py, -s * px + c * py], axis=-1)
    new_cs = None
    if cs is not None:
        new_cs = np.stack([c * cs[..., 0] + s * cs[..., 1], -s * cs[..., 0] + c * cs[..., 1]], axis=-1)
    return new_xy, new_cs


def transform_tokens(obs: Observation, delta_pose) -> Observation:
    """Re-express the token fields of ``obs`` in another ego frame; bev and ego_state untouched.

    ``delta_pose`` (3,) or [B, 3] for a batch: the new ego pose expressed in the old ego frame
    (``relative_pose(old_pose, new_pose)``). Positions, heading directions and velocities are
    transformed; padded rows stay zero, masks are unchanged.
    """
    d = np.asarray(delta_pose, np.float64)
    if d.shape != obs.batch_shape + (3,):
        raise ObservationError(
            f"delta_pose: shape {d.shape} does not match batch shape {obs.batch_shape} + (3,)"
        )
    c, s = np.cos(d[..., 2]), np.sin(d[..., 2])
    dx, dy = d[..., 0], d[..., 1]

    def expand(a, extra):
        return a.reshape(a.shape + (1,) * extra)

    out = obs.copy()
    # map polylines [..., N, P, 8] (the signal features do not depend on the frame)
    cm, sm, xm, ym = (expand(v, 2) for v in (c, s, dx, dy))
    mp = obs.map_polylines.astype(np.float64)
    xy, cs = _apply_se2(mp[..., 0:2], mp[..., 2:4], cm, sm, xm, ym)
    live = expand(obs.map_mask, 1)[..., None]
    out.map_polylines[..., 0:2] = np.where(live, xy, 0.0)
    out.map_polylines[..., 2:4] = np.where(live, cs, 0.0)
    # agents [..., N, 10]
    ca, sa, xa, ya = (expand(v, 1) for v in (c, s, dx, dy))
    ag = obs.agents.astype(np.float64)
    xy, cs = _apply_se2(ag[..., 0:2], ag[..., 2:4], ca, sa, xa, ya)
    _, vel = _apply_se2(ag[..., 4:6], ag[..., 4:6], ca, sa, 0.0, 0.0)
    live = obs.agents_mask[..., None]
    out.agents[..., 0:2] = np.where(live, xy, 0.0)
    out.agents[..., 2:4] = np.where(live, cs, 0.0)
    out.agents[..., 4:6] = np.where(live, vel, 0.0)
    # route [..., N, 4]
    rt = obs.route.astype(np.float64)
    xy, cs = _apply_se2(rt[..., 0:2], rt[..., 2:4], ca, sa, xa, ya)
    live = obs.route_mask[..., None]
    out.route[..., 0:2] = np.where(live, xy, 0.0)
    out.route[..., 2:4] = np.where(live, cs, 0.0)
    return out
