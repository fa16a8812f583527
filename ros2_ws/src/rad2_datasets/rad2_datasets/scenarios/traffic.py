"""Background traffic for a SUMO network: vehicle types and random trips (randomTrips-like), all
drawn from a numpy Generator so a seed fixes the demand exactly.

Trips start on source fringe edges and end on sink fringe edges (so background vehicles enter and
leave at the network border rather than appearing mid-road); SUMO routes them at insertion.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from xml.sax.saxutils import quoteattr

import numpy as np

EGO_TYPE = "ego"
ACTOR_TYPE = "actor"


def _rng_range(rng: np.random.Generator, bounds, name: str) -> float:
    lo, hi = _bounds(bounds, name)
    return float(rng.uniform(lo, hi))


def _bounds(bounds, name: str) -> tuple[float, float]:
    try:
        lo, hi = float(bounds[0]), float(bounds[1])
    except (TypeError, IndexError, ValueError) as exc:
        raise ValueError(f"{name}: expected a [low, high] pair, got {bounds!r}") from exc
    if hi < lo:
        raise ValueError(f"{name}: low {lo} is greater than high {hi}")
    return lo, hi


def sample_range(rng: np.random.Generator, bounds, name: str) -> float:
    """Uniform sample from a ``[low, high]`` parameter pair (error names the parameter)."""
    return _rng_range(rng, bounds, name)


def passenger_edges(net) -> list:
    return sorted(
        (e for e in net.getEdges() if e.allows("passenger") and e.getFunction() == ""),
        key=lambda e: e.getID(),
    )


def fringe_edges(net) -> tuple[list, list]:
    """(sources, sinks): edges entering the network from its border / leaving it."""
    edges = passenger_edges(net)
    sources, sinks = [], []
    for e in edges:
        frm, to = e.getFromNode(), e.getToNode()
        if all(i.getFromNode() is to for i in frm.getIncoming()):
            sources.append(e)
        if all(o.getToNode() is frm for o in to.getOutgoing()):
            sinks.append(e)
    return sources, sinks


@dataclass
class VehicleTypeSet:
    xml: str
    ids: list[str]
    sizes: dict[str, tuple[float, float]]  # type id -> (length, width)


def vehicle_types(
    rng: np.random.Generator, bg: dict, ego: dict, vehicle: dict, n_car_types: int = 6, n_truck_types: int = 2
) -> VehicleTypeSet:
    """vType XML: a few background car/truck types of sampled size, the ego type and the actor type."""
    lines, ids, sizes = [], [], {}

    def vtype(tid, vclass, length, width, accel, decel, edecel, tau, sigma, extra=""):
        sizes[tid] = (length, width)
        return (
            f'<vType id="{tid}" vClass="{vclass}" length="{length:.2f}" width="{width:.2f}" '
            f'accel="{accel}" decel="{decel}" emergencyDecel="{edecel}" tau="{tau}" sigma="{sigma}" '
            f'minGap="{float(ego["min_gap_m"])}" {extra}/>'
        )

    common = dict(
        accel=float(bg["accel_mps2"]),
        decel=float(bg["decel_mps2"]),
        edecel=float(bg["emergency_decel_mps2"]),
        tau=float(bg["tau_s"]),
        sigma=float(bg["sigma"]),
    )
    speed = f'speedFactor="normc({float(bg["speed_factor_mean"])},{float(bg["speed_factor_dev"])},0.5,1.5)"'
    for k in range(n_car_types):
        tid = f"car{k}"
        lines.append(
            vtype(
                tid,
                "passenger",
                sample_range(rng, bg["vehicle_length_m"], "background.vehicle_length_m"),
                sample_range(rng, bg["vehicle_width_m"], "background.vehicle_width_m"),
                **common,
                extra=speed,
            )
        )
        ids.append(tid)
    for k in range(n_truck_types):
        tid = f"truck{k}"
        lines.append(
            vtype(
                tid,
                "passenger",
                sample_range(rng, bg["truck_length_m"], "background.truck_length_m"),
                float(bg["truck_width_m"]),
                **{**common, "accel": 1.3},
                extra=speed,
            )
        )
        ids.append(tid)
    lines.append(
        vtype(
            EGO_TYPE,
            "passenger",
            float(vehicle["length"]),
            float(vehicle["width"]),
            float(ego["accel_mps2"]),
            float(ego["decel_mps2"]),
            float(ego["emergency_decel_mps2"]),
            float(ego["tau_s"]),
            float(ego["sigma"]),
            extra=f'speedFactor="{float(ego["speed_factor"])}" maxSpeed="{float(ego["max_speed_mps"])}"',
        )
    )
    # actors: ordinary cars whose behaviour the event controller overrides; they may move sideways
    # while (almost) standing so a parked car can pull out
    lines.append(
        vtype(
            ACTOR_TYPE,
            "passenger",
            4.5,
            1.85,
            3.0,
            4.5,
            9.0,
            1.0,
            0.0,
            extra='speedFactor="1.0" lcMaxSpeedLatStanding="0.6" lcMaxSpeedLatFactor="2.0"',
        )
    )
    return VehicleTypeSet("\n".join(lines), ids, sizes)


def background_trips(
    rng: np.random.Generator,
    net,
    types: VehicleTypeSet,
    bg: dict,
    period_s: float,
    end_s: float,
    truck_fraction: float,
) -> list[str]:
    """``<trip>`` lines with exponential inter-departure times, fringe-to-fringe, min straight length."""
    if period_s <= 0:
        raise ValueError(f"background.period_s must be positive, got {period_s}")
    sources, sinks = fringe_edges(net)
    if not sources or not sinks:
        edges = passenger_edges(net)
        sources, sinks = edges, edges
    min_len = float(bg["min_trip_length_m"])
    cars = [t for t in types.ids if t.startswith("car")]
    trucks = [t for t in types.ids if t.startswith("truck")] or cars
    trips, t, n = [], 0.0, 0
    src_xy = np.array([e.getToNode().getCoord()[:2] for e in sources])
    dst_xy = np.array([e.getFromNode().getCoord()[:2] for e in sinks])
    while True:
        t += float(rng.exponential(period_s))
        if t >= end_s:
            break
        i = int(rng.integers(len(sources)))
        far = np.flatnonzero(np.linalg.norm(dst_xy - src_xy[i], axis=1) >= min_len)
        if len(far) == 0:
            continue
        j = int(far[rng.integers(len(far))])
        if (
            sinks[j].getToNode() is sources[i].getFromNode()
            and sinks[j].getFromNode() is sources[i].getToNode()
        ):
            continue  # the reverse edge: a U-turn trip
        vt = (
            trucks[rng.integers(len(trucks))]
            if rng.random() < truck_fraction
            else cars[rng.integers(len(cars))]
        )
        trips.append(
            f'<trip id="bg{n}" type="{vt}" depart="{t:.1f}" from={quoteattr(sources[i].getID())} '
            f'to={quoteattr(sinks[j].getID())} departLane="best" departSpeed="max"/>'
        )
        n += 1
    return trips


def write_routes(path: Path, types: VehicleTypeSet, trips: list[str]) -> Path:
    path.write_text("<routes>\n" + types.xml + "\n" + "\n".join(trips) + "\n</routes>\n")
    return path
