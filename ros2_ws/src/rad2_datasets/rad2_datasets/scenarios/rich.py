"""Richer generated scenes (``--rich``): pedestrians and cyclists, parked cars at the kerb, varied lane
widths, ego sizes and traffic densities, on top of any scenario kind.

Everything here is drawn from its own random stream (:func:`draw_settings` gets a generator spawned
apart from the network, event and SUMO streams), so switching ``rich`` off gives exactly the clips the
committed sets were generated with.

- Lane width: the clip's network is built with one of ``rich.lane_width_m`` (a separate cached network
  per width) and, away from the motorway, with sidewalks and pedestrian crossings.
- Pedestrians walk sidewalk-to-sidewalk trips routed by SUMO (over crossings, obeying their signals);
  cyclists are background vehicles of SUMO class ``bicycle`` sharing the road lanes.
- Parked cars are not SUMO vehicles: SUMO parks a vehicle on its lane, not beside it. They are
  placed after the run along the kerb of the rightmost lanes of streets (not the motorway) near the
  ego's path, at places no logged road user ever touches (so the log stays collision-free by
  construction), standing still all clip.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from xml.sax.saxutils import quoteattr

import numpy as np
from rad2_core.geometry import boxes_overlap, wrap_angle

from rad2_datasets.scenarios.traffic import fringe_edges, sample_range

PEDESTRIAN_PREFIX = "ped"
CYCLIST_PREFIX = "cyc"
PARKED_PREFIX = "parked"
_PED_TYPES = 3
_CYCLIST_TYPES = 2


@dataclass(frozen=True)
class RichSettings:
    """What one clip drew from ``scenarios.rich`` (kept in the clip metadata under ``rich``)."""

    lane_width_m: float
    ego_length_m: float
    ego_width_m: float
    period_scale: float  # background departure period multiplier (< 1: denser traffic)
    pedestrian_period_s: float
    cyclist_fraction: float
    parked_count: int

    def as_metadata(self) -> dict:
        return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in asdict(self).items()}


@dataclass
class RichRun:
    """What :func:`runner.run_scenario` needs for a rich scene: the ``scenarios.rich`` block, the clip's
    settings and the random stream reserved for rich-scene draws."""

    cfg: dict
    settings: RichSettings
    rng: np.random.Generator


def _choice(rng: np.random.Generator, values, name: str) -> float:
    vals = [float(v) for v in values]
    if not vals:
        raise ValueError(f"scenarios.rich.{name} is empty")
    return vals[int(rng.integers(len(vals)))]


def draw_settings(rich: dict, rng: np.random.Generator) -> RichSettings:
    """One clip's rich-scene settings from the ``scenarios.rich`` block."""
    lo, hi = (int(v) for v in rich["parked"]["count"])
    if not 0 <= lo <= hi:
        raise ValueError(f"scenarios.rich.parked.count: expected 0 <= low <= high, got {[lo, hi]}")
    return RichSettings(
        lane_width_m=_choice(rng, rich["lane_width_m"], "lane_width_m"),
        ego_length_m=sample_range(rng, rich["ego_length_m"], "rich.ego_length_m"),
        ego_width_m=sample_range(rng, rich["ego_width_m"], "rich.ego_width_m"),
        period_scale=sample_range(rng, rich["period_scale"], "rich.period_scale"),
        pedestrian_period_s=sample_range(rng, rich["pedestrians"]["period_s"], "rich.pedestrians.period_s"),
        cyclist_fraction=sample_range(rng, rich["cyclists"]["fraction"], "rich.cyclists.fraction"),
        parked_count=int(rng.integers(lo, hi + 1)),
    )


def _sidewalk_edges(net) -> list:
    """Ordinary edges with a sidewalk (a lane for pedestrians but not cars). The motorway has none: its
    lanes admit every class, and nobody should walk or cycle there."""
    return sorted(
        (
            e for e in net.getEdges()
            if e.getFunction() == ""
            and any(ln.allows("pedestrian") and not ln.allows("passenger") for ln in e.getLanes())
        ),
        key=lambda e: e.getID(),
    )


def road_user_xml(
    rich: dict, settings: RichSettings, rng: np.random.Generator, net, end_s: float
) -> str | None:
    """A SUMO route file body with the pedestrians (``<person>`` walks) and cyclists (``<trip>`` of
    class bicycle), or None on a network without sidewalks (the motorway).
    Departures are exponential with the clip's periods; both lists are sorted by departure time."""
    walk_edges = _sidewalk_edges(net)
    if not walk_edges:
        return None
    ped, cyc = rich["pedestrians"], rich["cyclists"]
    lines = []
    for k in range(_PED_TYPES):
        lines.append(
            f'<vType id="{PEDESTRIAN_PREFIX}{k}" vClass="pedestrian" length="{float(ped["length_m"]):.2f}" '
            f'width="{float(ped["width_m"]):.2f}" '
            f'maxSpeed="{sample_range(rng, ped["speed_mps"], "rich.pedestrians.speed_mps"):.2f}"/>'
        )
    for k in range(_CYCLIST_TYPES):
        lines.append(
            f'<vType id="{CYCLIST_PREFIX}{k}" vClass="bicycle" length="{float(cyc["length_m"]):.2f}" '
            f'width="{float(cyc["width_m"]):.2f}" accel="1.2" decel="3.0" emergencyDecel="6.0" sigma="0.5" '
            f'maxSpeed="{sample_range(rng, cyc["speed_mps"], "rich.cyclists.speed_mps"):.2f}"/>'
        )
    entries: list[tuple[float, str]] = []
    xy = np.array([e.getFromNode().getCoord()[:2] for e in walk_edges])
    min_len = float(ped["min_trip_length_m"])
    t, n = 0.0, 0
    while True:
        t += float(rng.exponential(settings.pedestrian_period_s))
        if t >= end_s:
            break
        i = int(rng.integers(len(walk_edges)))
        far = np.flatnonzero(np.linalg.norm(xy - xy[i], axis=1) >= min_len)
        if len(far) == 0:
            continue
        j = int(far[rng.integers(len(far))])
        entries.append((t, (
            f'<person id="{PEDESTRIAN_PREFIX}{n}" type="{PEDESTRIAN_PREFIX}{int(rng.integers(_PED_TYPES))}" '
            f'depart="{t:.1f}" departPos="random"><walk from={quoteattr(walk_edges[i].getID())} '
            f'to={quoteattr(walk_edges[j].getID())}/></person>'
        )))
        n += 1
    if settings.cyclist_fraction > 0.0:
        sources, sinks = fringe_edges(net)
        bike_src = [e for e in sources if e.allows("bicycle")]
        bike_dst = [e for e in sinks if e.allows("bicycle")]
        period = float(cyc["period_s"]) / settings.cyclist_fraction
        t, n = 0.0, 0
        while bike_src and bike_dst:
            t += float(rng.exponential(period))
            if t >= end_s:
                break
            a, b = bike_src[int(rng.integers(len(bike_src)))], bike_dst[int(rng.integers(len(bike_dst)))]
            if b.getFromNode() is a.getToNode() and b.getToNode() is a.getFromNode():
                continue  # a U-turn trip
            entries.append((t, (
                f'<trip id="{CYCLIST_PREFIX}{n}" type="{CYCLIST_PREFIX}{int(rng.integers(_CYCLIST_TYPES))}" '
                f'depart="{t:.1f}" from={quoteattr(a.getID())} to={quoteattr(b.getID())} '
                f'departLane="best" departSpeed="max"/>'
            )))
            n += 1
    entries.sort(key=lambda e: e[0])
    return "\n".join(lines + [e[1] for e in entries])


def write_road_users(path: Path, body: str) -> Path:
    path.write_text("<routes>\n" + body + "\n</routes>\n")
    return path


def kerb_lanes(net) -> list:
    """The rightmost car lane of every ordinary (non-junction) edge with a sidewalk: where a car parks
    at the kerb. The motorway has no kerb (and nobody parks on it)."""
    out = []
    for e in _sidewalk_edges(net):
        car_lanes = [ln for ln in e.getLanes() if ln.allows("passenger")]
        if car_lanes:
            out.append(car_lanes[0])  # SUMO numbers lanes from the right
    return sorted(out, key=lambda ln: ln.getID())


def _lane_point(shape: np.ndarray, s: float) -> tuple[np.ndarray, float]:
    seg = np.diff(shape, axis=0)
    cum = np.concatenate([[0.0], np.cumsum(np.linalg.norm(seg, axis=1))])
    k = int(np.clip(np.searchsorted(cum, s, side="right") - 1, 0, len(seg) - 1))
    d = seg[k] / max(np.linalg.norm(seg[k]), 1e-9)
    return shape[k] + d * (s - cum[k]), float(np.arctan2(d[1], d[0]))


def place_parked(
    rich: dict,
    settings: RichSettings,
    rng: np.random.Generator,
    net,
    ego_xy: np.ndarray,
    ego_boxes: np.ndarray,
    agent_boxes: list[np.ndarray],
    size_ranges: dict,
) -> list[np.ndarray]:
    """Up to ``settings.parked_count`` parked-car boxes ``[x, y, yaw, length, width]`` along the kerb
    within ``rich.parked.max_distance_m`` of the ego's logged path. A candidate is dropped when it
    overlaps (inflated by ``rich.parked.clearance_m``) the logged ego or any logged road user at any
    step, another parked car, or lies within ``rich.parked.end_margin_m`` of a junction."""
    park = rich["parked"]
    clearance = float(park["clearance_m"])
    margin = float(park["end_margin_m"])
    reach = float(park["max_distance_m"])
    lanes = []
    for ln in kerb_lanes(net):
        shape = np.asarray(ln.getShape(), dtype=np.float64)[:, :2]
        if ln.getLength() < 2 * margin + 6.0:
            continue
        d = np.min(np.linalg.norm(shape[:, None, :] - ego_xy[None, ::10, :], axis=-1))
        if d <= reach + ln.getLength():
            lanes.append((ln, shape))
    if not lanes or settings.parked_count == 0:
        return []
    others = [b for b in agent_boxes if len(b)] + [ego_boxes]
    others_arr = np.concatenate(others, axis=0) if others else np.zeros((0, 5))
    grown = others_arr.copy()
    grown[:, 3:] += 2.0 * clearance
    placed: list[np.ndarray] = []
    for _ in range(settings.parked_count * int(park["tries_per_car"])):
        if len(placed) >= settings.parked_count:
            break
        ln, shape = lanes[int(rng.integers(len(lanes)))]
        length = sample_range(rng, size_ranges["vehicle_length_m"], "background.vehicle_length_m")
        width = sample_range(rng, size_ranges["vehicle_width_m"], "background.vehicle_width_m")
        intrusion = sample_range(rng, park["intrusion_m"], "rich.parked.intrusion_m")
        s = float(rng.uniform(margin, np.sum(np.linalg.norm(np.diff(shape, axis=0), axis=1)) - margin))
        centre, heading = _lane_point(shape, s)
        right = np.array([np.sin(heading), -np.cos(heading)])
        offset = 0.5 * ln.getWidth() + 0.5 * width - intrusion
        xy = centre + offset * right
        if np.min(np.linalg.norm(ego_xy - xy, axis=1)) > reach:
            continue
        box = np.array([xy[0], xy[1], wrap_angle(heading), length, width])
        if len(grown) and boxes_overlap(box[None], grown).any():
            continue
        if placed:
            spaced = np.array(placed)
            spaced[:, 3:] += 2.0 * float(park["min_gap_m"])
            if boxes_overlap(box[None], spaced).any():
                continue
        placed.append(box)
    return placed
