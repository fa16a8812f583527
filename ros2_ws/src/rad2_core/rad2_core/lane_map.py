"""Lane-level maps (:class:`LaneMap`): lanes, their adjacency, traffic signals and the queries on them.

A map is in the world frame (x east, y north, metres, radians CCW from +x) and is shared between the
clips of one road network; ``map_id`` is a content hash, so a dataset stores each map once. Lane ``k``
is described by index ``k`` of every per-lane list. Traffic signals are part of the map (which lanes
a signal controls, where traffic stops); their states per step belong to a clip. See
``docs/conventions.md`` for the contract.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

import numpy as np

from rad2_core.field_checks import SAFE_ID, ClipValidationError, check_array, check_polylines

# Traffic-signal states, identical to rad2_msgs/TrafficSignal (arrows and flashing map onto these:
# a flashing red is a stop sign, a flashing yellow is caution; adapters document their mapping).
SIGNAL_UNKNOWN = 0
SIGNAL_RED = 1
SIGNAL_YELLOW = 2
SIGNAL_GREEN = 3
SIGNAL_STATE_NAMES = {SIGNAL_UNKNOWN: "unknown", SIGNAL_RED: "red", SIGNAL_YELLOW: "yellow",
                      SIGNAL_GREEN: "green"}
# which of two states a lane controlled by both must obey (the higher)
SIGNAL_RESTRICTIVENESS = {SIGNAL_UNKNOWN: 0, SIGNAL_GREEN: 1, SIGNAL_YELLOW: 2, SIGNAL_RED: 3}
# "no neighbour" in LaneMap.left_neighbors / right_neighbors (never a valid lane id)
NO_LANE = -1


def _lane_refs(values) -> np.ndarray:
    """Lane ids with None for "no lane" -> int64 array with NO_LANE."""
    return np.array([NO_LANE if v is None else int(v) for v in values], dtype=np.int64).reshape(-1)


@dataclass
class LaneMap:
    """A lane-level map in the world frame. Lane ``k`` is described by index ``k`` of every list."""

    map_id: str
    lane_ids: np.ndarray  # [L] int64
    centerlines: list[np.ndarray]  # [Pi, 2]
    left_boundaries: list[np.ndarray]  # [Qi, 2]
    right_boundaries: list[np.ndarray]  # [Qi, 2]
    speed_limits: np.ndarray  # [L] m/s
    successors: list[list[int]]  # lane ids
    drivable_areas: list[np.ndarray] = field(default_factory=list)  # [Ki, 2] polygons
    crosswalks: list[np.ndarray] = field(default_factory=list)  # [Ki, 2] polygons
    # Lane adjacency (same direction of travel): the neighbour's lane id or NO_LANE, and whether a lane
    # change into it is allowed (dashed marking / routing-graph "lane change" relation). Empty arrays:
    # the source has no adjacency (old maps); otherwise one entry per lane.
    left_neighbors: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # [L] or [0]
    right_neighbors: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    lane_change_left: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))
    lane_change_right: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))
    # Traffic signals: signal s controls the lanes signal_lanes[s] (lane ids) and traffic stops before
    # signal_stop_lines[s] ([K >= 2, 2] polyline across those lanes). Their states per step are in
    # Clip.signal_states (a map is shared by clips, states are not).
    signal_ids: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # [S]
    signal_lanes: list[list[int]] = field(default_factory=list)
    signal_stop_lines: list[np.ndarray] = field(default_factory=list)

    @classmethod
    def build(
        cls,
        lane_ids,
        centerlines,
        left_boundaries,
        right_boundaries,
        speed_limits,
        successors,
        drivable_areas=(),
        crosswalks=(),
        map_id: str | None = None,
        left_neighbors=(),
        right_neighbors=(),
        lane_change_left=(),
        lane_change_right=(),
        signal_ids=(),
        signal_lanes=(),
        signal_stop_lines=(),
    ) -> LaneMap:
        """Construct with normalised dtypes; ``map_id`` defaults to the content hash. Neighbours may
        be given as lane ids with ``None`` or NO_LANE for "none"."""
        m = cls(
            map_id="",
            lane_ids=np.asarray(lane_ids, dtype=np.int64).reshape(-1),
            centerlines=[np.asarray(p, dtype=np.float64).reshape(-1, 2) for p in centerlines],
            left_boundaries=[np.asarray(p, dtype=np.float64).reshape(-1, 2) for p in left_boundaries],
            right_boundaries=[np.asarray(p, dtype=np.float64).reshape(-1, 2) for p in right_boundaries],
            speed_limits=np.asarray(speed_limits, dtype=np.float64).reshape(-1),
            successors=[[int(s) for s in succ] for succ in successors],
            drivable_areas=[np.asarray(p, dtype=np.float64).reshape(-1, 2) for p in drivable_areas],
            crosswalks=[np.asarray(p, dtype=np.float64).reshape(-1, 2) for p in crosswalks],
            left_neighbors=_lane_refs(left_neighbors),
            right_neighbors=_lane_refs(right_neighbors),
            lane_change_left=np.asarray(lane_change_left, dtype=bool).reshape(-1),
            lane_change_right=np.asarray(lane_change_right, dtype=bool).reshape(-1),
            signal_ids=np.asarray(signal_ids, dtype=np.int64).reshape(-1),
            signal_lanes=[[int(v) for v in lanes] for lanes in signal_lanes],
            signal_stop_lines=[np.asarray(p, dtype=np.float64).reshape(-1, 2) for p in signal_stop_lines],
        )
        m.map_id = map_id if map_id is not None else m.content_hash()
        return m

    @property
    def has_adjacency(self) -> bool:
        return len(self.left_neighbors) > 0

    @property
    def num_signals(self) -> int:
        return int(len(self.signal_ids))

    def lane_signal_states(self, signal_states) -> np.ndarray:
        """[L] int8 state (SIGNAL_*) of the light controlling each lane, in ``lane_ids`` order.

        ``signal_states`` ([S], rows of ``signal_ids``; None: not known). A lane no signal controls is
        SIGNAL_UNKNOWN; a lane two signals control takes the more restrictive state (red over yellow over
        green), because that is the one the driver must obey.
        """
        out = np.zeros(len(self.lane_ids), np.int8)
        if signal_states is None or not self.num_signals:
            return out
        states = np.asarray(signal_states).reshape(-1)
        if len(states) != self.num_signals:
            raise ClipValidationError(
                f"signal_states: {len(states)} values for the map's {self.num_signals} signals")
        bad = ~np.isin(states, list(SIGNAL_RESTRICTIVENESS))
        if bad.any():
            raise ClipValidationError(f"signal_states: unknown state {int(states[bad][0])} (expected one of "
                                      f"{sorted(SIGNAL_STATE_NAMES)})")
        # (signal, lane) pairs as flat arrays: vectorised, since the BEV and the tokens ask every frame
        counts = [len(lanes) for lanes in self.signal_lanes]
        signal_of = np.repeat(np.arange(len(counts)), counts)
        controlled = np.array([lid for lanes in self.signal_lanes for lid in lanes], np.int64)
        order = np.argsort(self.lane_ids, kind="stable")
        at = np.clip(np.searchsorted(self.lane_ids[order], controlled), 0, len(order) - 1)
        known = self.lane_ids[order][at] == controlled
        rank_of_state = np.zeros(max(SIGNAL_RESTRICTIVENESS) + 1, np.int8)
        state_of_rank = np.zeros(max(SIGNAL_RESTRICTIVENESS.values()) + 1, np.int8)
        for state, rank in SIGNAL_RESTRICTIVENESS.items():
            rank_of_state[state], state_of_rank[rank] = rank, state
        rank = np.zeros(len(self.lane_ids), np.int8)
        np.maximum.at(rank, order[at[known]], rank_of_state[states.astype(np.int64)[signal_of[known]]])
        return state_of_rank[rank]

    def neighbor(self, lane_id: int, side: str) -> int | None:
        """The left or right neighbour's lane id (``side`` "left"/"right"), or None."""
        if not self.has_adjacency:
            return None
        k = self.lane_index().get(int(lane_id))
        if k is None:
            raise KeyError(f"lane id {lane_id} is not in map {self.map_id}")
        v = int((self.left_neighbors if side == "left" else self.right_neighbors)[k])
        return None if v == NO_LANE else v

    @property
    def num_lanes(self) -> int:
        return int(len(self.lane_ids))

    def content_hash(self) -> str:
        """16-hex-digit SHA-256 of the map's content (coordinates quantised to millimetres)."""
        h = hashlib.sha256()

        def add_polys(tag: str, polys) -> None:
            h.update(tag.encode())
            h.update(np.int64(len(polys)).tobytes())
            for p in polys:
                q = np.round(np.asarray(p, dtype=np.float64) * 1000.0).astype(np.int64)
                h.update(np.int64(len(q)).tobytes())
                h.update(q.tobytes())

        h.update(np.asarray(self.lane_ids, dtype=np.int64).tobytes())
        add_polys("c", self.centerlines)
        add_polys("l", self.left_boundaries)
        add_polys("r", self.right_boundaries)
        h.update(np.round(np.asarray(self.speed_limits, dtype=np.float64) * 1000).astype(np.int64).tobytes())
        h.update(json.dumps([list(map(int, s)) for s in self.successors]).encode())
        add_polys("d", self.drivable_areas)
        add_polys("x", self.crosswalks)
        # only maps that have them hash the new fields, so the ids of older maps stay what they were
        if self.has_adjacency:
            h.update(b"adj")
            for a in (self.left_neighbors, self.right_neighbors):
                h.update(np.asarray(a, np.int64).tobytes())
            for a in (self.lane_change_left, self.lane_change_right):
                h.update(np.asarray(a, bool).tobytes())
        if self.num_signals:
            h.update(b"sig")
            h.update(np.asarray(self.signal_ids, np.int64).tobytes())
            h.update(json.dumps([list(map(int, s)) for s in self.signal_lanes]).encode())
            add_polys("s", self.signal_stop_lines)
        return h.hexdigest()[:16]

    def drivable_geometry(self, margin: float = 0.0):
        """The road as one shapely geometry: the drivable-area polygons and every lane's ring (left bound,
        right bound reversed), buffered by ``margin`` m; None for a map with neither. What the simulator
        calls on the road, and where a logged route may run."""
        import shapely
        from shapely.geometry import Polygon

        polys = [Polygon(p).buffer(0) for p in self.drivable_areas if len(p) >= 3]
        for left, right in zip(self.left_boundaries, self.right_boundaries):
            ring = np.concatenate([left, right[::-1]])
            if len(ring) >= 3:
                polys.append(Polygon(ring).buffer(0))
        return shapely.unary_union(polys).buffer(margin) if polys else None

    def lane_index(self) -> dict[int, int]:
        """lane id -> index into the per-lane lists."""
        return {int(lid): k for k, lid in enumerate(self.lane_ids)}

    def validate(self) -> None:
        if not isinstance(self.map_id, str) or not SAFE_ID.match(self.map_id or ""):
            raise ClipValidationError(f"map.map_id: {self.map_id!r} is not a non-empty file-name-safe string")
        if not isinstance(self.lane_ids, np.ndarray) or self.lane_ids.ndim != 1:
            raise ClipValidationError(
                f"map.lane_ids: expected a [L] array, got shape {getattr(self.lane_ids, 'shape', None)}"
            )
        n = len(self.lane_ids)
        if n == 0:
            raise ClipValidationError("map.lane_ids: the map has no lanes (L=0)")
        if self.lane_ids.dtype.kind not in "iu":
            raise ClipValidationError(f"map.lane_ids: dtype {self.lane_ids.dtype} is not integer")
        if len(np.unique(self.lane_ids)) != n:
            raise ClipValidationError("map.lane_ids: contains duplicate ids")
        check_polylines("map.centerlines", self.centerlines, 2, n)
        check_polylines("map.left_boundaries", self.left_boundaries, 2, n)
        check_polylines("map.right_boundaries", self.right_boundaries, 2, n)
        check_array("map.speed_limits", self.speed_limits, (n,), f"L={n}")
        if np.any(self.speed_limits <= 0):
            raise ClipValidationError(f"map.speed_limits: value {self.speed_limits.min()} is not positive")
        if not isinstance(self.successors, list) or len(self.successors) != n:
            raise ClipValidationError(
                f"map.successors: has {len(self.successors)} entries, expected {n} (one per lane)"
            )
        known = set(int(v) for v in self.lane_ids)
        for k, succ in enumerate(self.successors):
            for s in succ:
                if int(s) not in known:
                    raise ClipValidationError(f"map.successors[{k}]: lane id {s} is not in map.lane_ids")
        check_polylines("map.drivable_areas", self.drivable_areas, 3)
        check_polylines("map.crosswalks", self.crosswalks, 3)
        if NO_LANE in known:
            raise ClipValidationError(f"map.lane_ids: {NO_LANE} is reserved for 'no neighbour'")
        adj = (self.left_neighbors, self.right_neighbors, self.lane_change_left, self.lane_change_right)
        names = ("map.left_neighbors", "map.right_neighbors", "map.lane_change_left", "map.lane_change_right")
        if any(len(a) for a in adj):
            for name, a in zip(names, adj):
                check_array(name, a, (n,), f"L={n}", finite=False)
            for name, a in zip(names[:2], adj[:2]):
                for k, v in enumerate(a):
                    if int(v) != NO_LANE and int(v) not in known:
                        raise ClipValidationError(f"{name}[{k}]: lane id {int(v)} is not in map.lane_ids")
                    if int(v) == int(self.lane_ids[k]):
                        raise ClipValidationError(f"{name}[{k}]: lane {int(v)} is its own neighbour")
            for name, allowed, nb in zip(names[2:], adj[2:], adj[:2]):
                bad = np.flatnonzero(np.asarray(allowed, bool) & (np.asarray(nb) == NO_LANE))
                if len(bad):
                    raise ClipValidationError(f"{name}[{int(bad[0])}]: a lane change is allowed but there is "
                                              "no neighbour on that side")
        s_count = len(self.signal_ids)
        if not isinstance(self.signal_ids, np.ndarray) or self.signal_ids.ndim != 1:
            raise ClipValidationError(
                f"map.signal_ids: expected a [S] array, got {type(self.signal_ids).__name__}")
        if len(np.unique(self.signal_ids)) != s_count:
            raise ClipValidationError("map.signal_ids: contains duplicate ids")
        if len(self.signal_lanes) != s_count:
            raise ClipValidationError(
                f"map.signal_lanes: has {len(self.signal_lanes)} entries, expected {s_count} "
                "(one per signal)")
        for k, lanes in enumerate(self.signal_lanes):
            if not lanes:
                raise ClipValidationError(
                    f"map.signal_lanes[{k}]: signal {int(self.signal_ids[k])} controls no lane")
            for lid in lanes:
                if int(lid) not in known:
                    raise ClipValidationError(f"map.signal_lanes[{k}]: lane id {lid} is not in map.lane_ids")
        check_polylines("map.signal_stop_lines", self.signal_stop_lines, 2, s_count)

