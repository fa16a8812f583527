"""Run one SUMO scenario in-process with libsumo and record the ego and its surroundings at 10 Hz.

Flow of :func:`run_scenario`: background traffic warms up, the ego (one SUMO vehicle of type
``ego``) is inserted on a sampled route, a short prologue lets it reach speed, the scenario's
event sets up its actors (they appear before the first logged step), then ``clip_steps`` steps are
logged while the event controller acts. Everything random comes from one seed.

SUMO reports a vehicle's *front bumper* position and its heading in degrees *clockwise from north*;
:func:`sumo_to_center` converts to the box centre and a yaw CCW from +x (docs/conventions.md).
"""

from __future__ import annotations

import math
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from rad2_core.clip import AGENT_CYCLIST, AGENT_PEDESTRIAN, AGENT_VEHICLE
from rad2_core.geometry import wrap_angle

from rad2_datasets.scenarios import rich as rich_scenes
from rad2_datasets.scenarios import traffic
from rad2_datasets.scenarios.networks import sumo_binary

EGO_ID = "ego"


class ScenarioRejected(Exception):
    """This seed did not give a usable scenario; ``reason`` is a short tag counted in statistics."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


def sumo_to_center(x_front, y_front, angle_deg, length):
    """SUMO front-bumper position and clockwise-from-north heading (deg) -> box centre and yaw (rad)."""
    yaw = wrap_angle(np.radians(90.0 - np.asarray(angle_deg, dtype=np.float64)))
    half = 0.5 * np.asarray(length, dtype=np.float64)
    x = np.asarray(x_front, dtype=np.float64) - half * np.cos(yaw)
    y = np.asarray(y_front, dtype=np.float64) - half * np.sin(yaw)
    return x, y, yaw


@dataclass
class AgentTrack:
    sumo_id: str
    vtype: str
    length: float
    width: float
    x: np.ndarray
    y: np.ndarray
    yaw: np.ndarray
    vx: np.ndarray
    vy: np.ndarray
    valid: np.ndarray
    agent_type: int = AGENT_VEHICLE  # clip.AGENT_*


@dataclass
class RawRecord:
    """What one run logged (world frame, box centres), before conversion to a Clip."""

    steps: int
    dt: float
    ego_length: float
    ego_width: float
    ego_x: np.ndarray
    ego_y: np.ndarray
    ego_yaw: np.ndarray
    ego_speed: np.ndarray
    ego_accel: np.ndarray
    ego_lanes: list[tuple[int, str, float]]  # (step, sumo lane id, lane position) when the lane changed
    remaining_edges: list[str]  # the ego's route edges from its last edge on
    last_lane: str
    agents: list[AgentTrack]
    event: dict[str, Any] = field(default_factory=dict)
    sumo_collisions: int = 0
    # junction-internal (via) lane of every signalised link -> [steps] int8 state (clip.SIGNAL_*)
    signals: dict[str, np.ndarray] = field(default_factory=dict)


# SUMO's link state letters -> clip.SIGNAL_*: r red, u red+amber (about to turn green: still a stop),
# y amber, G/g green (priority / yield), s green right turn after a stop, o/O off (no signal)
SUMO_SIGNAL_STATES = {"r": 1, "u": 1, "y": 2, "Y": 2, "g": 3, "G": 3, "s": 3, "o": 0, "O": 0}


def _signal_links(sim) -> list[tuple[str, int, str]]:
    """(traffic light id, link index, via lane) of every signalised link that has a junction lane."""
    out = []
    for tls in sim.trafficlight.getIDList():
        for i, links in enumerate(sim.trafficlight.getControlledLinks(tls)):
            if links and links[0][2]:
                out.append((tls, i, links[0][2]))
    return out


class SimContext:
    """Thin helpers over libsumo used by the event controllers."""

    def __init__(self, sim, net, rng: np.random.Generator, cfg: dict, ego_lcmode: int):
        self.sim = sim
        self.net = net
        self.rng = rng
        self.cfg = cfg
        self.ego_lcmode = ego_lcmode
        self.dt = float(cfg["sim"]["step_length_s"])
        self.record_step = -1  # index of the logged step being processed (-1 before logging)

    # ego / vehicles
    def present(self, vid: str) -> bool:
        return vid in self.sim.vehicle.getIDList()

    def lane_of(self, vid: str) -> tuple[str, int, float, str]:
        lane = self.sim.vehicle.getLaneID(vid)
        return (
            lane,
            self.sim.vehicle.getLaneIndex(vid),
            self.sim.vehicle.getLanePosition(vid),
            self.sim.vehicle.getRoadID(vid),
        )

    def speed(self, vid: str) -> float:
        return float(self.sim.vehicle.getSpeed(vid))

    def remaining_route(self, vid: str = EGO_ID) -> list[str]:
        route = list(self.sim.vehicle.getRoute(vid))
        return route[max(self.sim.vehicle.getRouteIndex(vid), 0) :]

    def lane_length(self, lane_id: str) -> float:
        return float(self.sim.lane.getLength(lane_id))

    def num_lanes(self, edge_id: str) -> int:
        return int(self.sim.edge.getLaneNumber(edge_id))

    def car_lane(self, edge_id: str, index: int) -> bool:
        """Whether lane ``index`` of the edge is open to cars (not a sidewalk of a rich scene)."""
        return bool(self.net.getEdge(edge_id).getLane(index).allows("passenger"))

    def leader(self, vid: str, dist: float) -> tuple[str, float] | None:
        res = self.sim.vehicle.getLeader(vid, dist)
        if not res or not res[0]:
            return None
        return res[0], float(res[1])

    def driving_distance(self, vid: str, x: float, y: float) -> float | None:
        d = float(self.sim.vehicle.getDrivingDistance2D(vid, x, y))
        return d if d > -1e6 else None

    def spawn(self, vid: str, edges: list[str], lane_index: int, pos: float, speed: float | str) -> None:
        """Insert an actor at the next step; ``speed`` in m/s or a SUMO keyword such as ``"max"``."""
        rid = f"route_{vid}"
        self.sim.route.add(rid, edges)
        speed_s = speed if isinstance(speed, str) else f"{max(speed, 0.0):.2f}"
        self.sim.vehicle.add(
            vid,
            rid,
            typeID=traffic.ACTOR_TYPE,
            depart="now",
            departLane=str(int(lane_index)),
            departPos=f"{pos:.2f}",
            departSpeed=speed_s,
        )

    def clear_lane(self, lane_id: str, pos_from: float, pos_to: float, keep=(EGO_ID,)) -> int:
        """Remove vehicles on a lane between two positions (only before logging starts)."""
        if self.record_step >= 0:
            raise RuntimeError("clear_lane is only allowed before the first logged step")
        n = 0
        for v in self.sim.lane.getLastStepVehicleIDs(lane_id):
            if v in keep:
                continue
            p = self.sim.vehicle.getLanePosition(v)
            if pos_from - self.sim.vehicle.getLength(v) <= p <= pos_to + self.sim.vehicle.getLength(v):
                self.sim.vehicle.remove(v)
                n += 1
        return n


def _choose_route(
    ctx: SimContext, rng: np.random.Generator, min_length: float, min_lanes: int, highway: bool
) -> list[str]:
    """A random ego route of at least ``min_length`` metres starting on an edge with ``min_lanes`` lanes."""
    edges = traffic.passenger_edges(ctx.net)
    starts = [
        e for e in edges
        if sum(ln.allows("passenger") for ln in e.getLanes()) >= min_lanes and e.getLength() >= 40.0
    ]
    if highway:  # the motorway's first mainline edge or a ramp
        starts = [e for e in starts if e.getFromNode().getIncoming() == []] or starts
    if not starts:
        raise ScenarioRejected("no_route", f"no start edge with {min_lanes} lanes")
    ids = [e.getID() for e in edges]
    for _ in range(60):
        s = starts[int(rng.integers(len(starts)))].getID()
        d = ids[int(rng.integers(len(ids)))]
        if d == s:
            continue
        r = ctx.sim.simulation.findRoute(s, d, vType=traffic.EGO_TYPE)
        if r.edges and float(r.length) >= min_length:
            return list(r.edges)
    raise ScenarioRejected("no_route", f"no route of {min_length:.0f} m found")


def _sumo_cmd(net_file: Path, routes: str, seed: int, sim_cfg: dict) -> list[str]:
    return [
        sumo_binary("sumo"),
        "-n",
        str(net_file),
        "-r",
        str(routes),
        "--step-length",
        str(float(sim_cfg["step_length_s"])),
        "--seed",
        str(int(seed) % (2**31)),
        "--lanechange.duration",
        str(float(sim_cfg["lane_change_duration_s"])),
        "--time-to-teleport",
        "-1",
        "--collision.action",
        str(sim_cfg["collision_action"]),
        "--collision.check-junctions",
        "true",
        "--ignore-route-errors",
        "true",
        "--no-step-log",
        "true",
        "--no-warnings",
        "true",
        "--duration-log.disable",
        "true",
        "--default.action-step-length",
        str(float(sim_cfg["step_length_s"])),
    ]


def run_scenario(
    event, net_kind: str, net_file: Path, net, seed: int, cfg: dict, vehicle: dict, demand: str,
    rich: rich_scenes.RichRun | None = None,
) -> RawRecord:
    """Simulate one scenario and log it (raises :class:`ScenarioRejected` when it is unusable).
    ``rich``: add pedestrians, cyclists, parked cars and the clip's traffic density (see ``rich``);
    ``vehicle`` then already carries the clip's ego size."""
    import libsumo as sim

    rng = np.random.default_rng(seed)
    sim_cfg, bg, ego_cfg = cfg["sim"], cfg["background"], cfg["ego"]
    dt = float(sim_cfg["step_length_s"])
    steps = int(sim_cfg["clip_steps"])
    if steps < 2:
        raise ValueError(f"scenarios.sim.clip_steps must be >= 2, got {steps}")
    periods = bg["period_s"].get(demand)
    if periods is None or net_kind not in periods:
        raise ValueError(
            f"scenarios.background.period_s has no entry for demand {demand!r}, network {net_kind!r}"
        )
    warmup = float(sim_cfg["warmup_s"])
    end_s = warmup + float(sim_cfg["ego_timeout_s"]) + float(sim_cfg["max_prologue_s"]) + steps * dt + 5.0
    period = float(periods[net_kind]) * (rich.settings.period_scale if rich else 1.0)
    types = traffic.vehicle_types(rng, bg, ego_cfg, vehicle)
    trips = traffic.background_trips(rng, net, types, bg, period, end_s, float(bg["truck_fraction"]))
    with tempfile.TemporaryDirectory(prefix="rad2_sumo_") as tmp:
        routes = str(traffic.write_routes(Path(tmp) / "bg.rou.xml", types, trips))
        users = rich_scenes.road_user_xml(rich.cfg, rich.settings, rich.rng, net, end_s) if rich else None
        if users is not None:  # its own file: SUMO wants each route file sorted by departure
            routes += "," + str(rich_scenes.write_road_users(Path(tmp) / "users.rou.xml", users))
        sim.start(_sumo_cmd(net_file, routes, seed, sim_cfg))
        try:
            raw = _simulate(sim, event, net_kind, net, rng, cfg, vehicle, dt, steps, warmup)
        finally:
            sim.close()
    if rich is not None:
        _add_parked(raw, rich, net, bg)
    return raw


def _add_parked(raw: RawRecord, rich: rich_scenes.RichRun, net, bg: dict) -> None:
    """Parked cars at the kerb near the ego's path, where no logged road user ever is (rich scenes)."""
    ego_xy = np.stack([raw.ego_x, raw.ego_y], axis=1)
    ones = np.ones(raw.steps)
    ego_boxes = np.column_stack([ego_xy, raw.ego_yaw, raw.ego_length * ones, raw.ego_width * ones])
    agent_boxes = [
        np.column_stack([a.x, a.y, a.yaw, a.length * ones, a.width * ones])[a.valid]
        for a in raw.agents
    ]
    boxes = rich_scenes.place_parked(
        rich.cfg, rich.settings, rich.rng, net, ego_xy, ego_boxes, agent_boxes, bg
    )
    for n, b in enumerate(boxes):
        const = [np.full(raw.steps, float(v)) for v in b[:3]]
        raw.agents.append(AgentTrack(
            f"{rich_scenes.PARKED_PREFIX}{n}", "parked", float(b[3]), float(b[4]), *const,
            np.zeros(raw.steps), np.zeros(raw.steps), np.ones(raw.steps, dtype=bool),
        ))


def _simulate(sim, event, net_kind, net, rng, cfg, vehicle, dt, steps, warmup) -> RawRecord:
    sim_cfg, ego_cfg = cfg["sim"], cfg["ego"]
    lcmode = int(
        ego_cfg["lane_change_mode_safety"] if event.safety else ego_cfg["lane_change_mode_efficiency"]
    )
    ctx = SimContext(sim, net, rng, cfg, lcmode)
    for _ in range(int(round(warmup / dt))):
        sim.simulationStep()
    speed_ref = max(e.getSpeed() for e in traffic.passenger_edges(net))
    min_len = speed_ref * (steps * dt + float(sim_cfg["max_prologue_s"])) * 0.8 + 50.0
    edges = _choose_route(ctx, rng, min_len, event.min_lanes, net_kind == "highway")
    sim.route.add("route_ego", edges)
    first_len = net.getEdge(edges[0]).getLength()
    depart_pos = float(rng.uniform(0.0, 0.3)) * first_len
    sim.vehicle.add(
        EGO_ID,
        "route_ego",
        typeID=traffic.EGO_TYPE,
        depart="now",
        departLane="best",
        departPos=f"{depart_pos:.2f}",
        departSpeed="max",
    )
    sim.vehicle.setLaneChangeMode(EGO_ID, lcmode)
    waited = 0.0
    while not ctx.present(EGO_ID):
        sim.simulationStep()
        waited += dt
        if waited > float(sim_cfg["ego_timeout_s"]):
            raise ScenarioRejected("ego_not_inserted")
    # prologue: reach speed, then let the event place its actors
    min_prologue = float(rng.uniform(1.0, 3.0))
    t = 0.0
    while True:
        sim.simulationStep()
        t += dt
        if not ctx.present(EGO_ID):
            raise ScenarioRejected("ego_left", "during the prologue")
        if t >= min_prologue and event.setup(ctx):
            break
        if t > float(sim_cfg["max_prologue_s"]):
            raise ScenarioRejected("setup_failed", event.setup_failure or "conditions never met")
    sim.simulationStep()
    if not ctx.present(EGO_ID):
        raise ScenarioRejected("ego_left", "at setup")
    event.confirm(ctx)
    return _record(sim, ctx, event, dt, steps, float(sim_cfg["record_radius_m"]), vehicle)


def _record(sim, ctx: SimContext, event, dt: float, steps: int, radius: float, vehicle: dict) -> RawRecord:
    ego_len, ego_wid = float(vehicle["length"]), float(vehicle["width"])
    ego = np.zeros((5, steps))
    lanes: list[tuple[int, str, float]] = []
    tracks: dict[str, dict] = {}
    collisions = 0
    last_lane = ""
    links = _signal_links(sim)
    signals = {via: np.zeros(steps, np.int8) for _, _, via in links}
    for k in range(steps):
        ctx.record_step = k
        states = {tls: sim.trafficlight.getRedYellowGreenState(tls) for tls in {t for t, _, _ in links}}
        for tls, i, via in links:
            signals[via][k] = SUMO_SIGNAL_STATES.get(states[tls][i], 0) if i < len(states[tls]) else 0
        if not ctx.present(EGO_ID):
            raise ScenarioRejected("ego_left", f"at logged step {k}")
        fx, fy = sim.vehicle.getPosition(EGO_ID)
        ex, ey, eyaw = sumo_to_center(fx, fy, sim.vehicle.getAngle(EGO_ID), ego_len)
        ego[:, k] = (ex, ey, eyaw, sim.vehicle.getSpeed(EGO_ID), sim.vehicle.getAcceleration(EGO_ID))
        lane = sim.vehicle.getLaneID(EGO_ID)
        if lane != last_lane:
            lanes.append((k, lane, float(sim.vehicle.getLanePosition(EGO_ID))))
            last_lane = lane
        for vid in sim.vehicle.getIDList():
            if vid == EGO_ID:
                continue
            px, py = sim.vehicle.getPosition(vid)
            if abs(px - ex) > radius + 20.0 or abs(py - ey) > radius + 20.0:
                continue
            tr = tracks.get(vid)
            length = tr["length"] if tr else float(sim.vehicle.getLength(vid))
            x, y, yaw = sumo_to_center(px, py, sim.vehicle.getAngle(vid), length)
            if math.hypot(float(x) - ex, float(y) - ey) > radius:
                continue
            if tr is None:
                tr = tracks[vid] = {
                    "length": length,
                    "width": float(sim.vehicle.getWidth(vid)),
                    "vtype": sim.vehicle.getTypeID(vid),
                    "data": np.zeros((6, steps)),
                    "type": AGENT_CYCLIST if sim.vehicle.getVehicleClass(vid) == "bicycle" else AGENT_VEHICLE,
                }
            v = float(sim.vehicle.getSpeed(vid))
            tr["data"][:, k] = (x, y, yaw, v * math.cos(yaw), v * math.sin(yaw), 1.0)
        for pid in sim.person.getIDList():  # pedestrians (rich scenes only), converted as vehicles are
            px, py = sim.person.getPosition(pid)
            if math.hypot(px - ex, py - ey) > radius:
                continue
            tr = tracks.get(pid)
            if tr is None:
                tr = tracks[pid] = {
                    "length": float(sim.person.getLength(pid)),
                    "width": float(sim.person.getWidth(pid)),
                    "vtype": sim.person.getTypeID(pid),
                    "data": np.zeros((6, steps)),
                    "type": AGENT_PEDESTRIAN,
                }
            x, y, yaw = sumo_to_center(px, py, sim.person.getAngle(pid), tr["length"])
            v = float(sim.person.getSpeed(pid))
            tr["data"][:, k] = (x, y, yaw, v * math.cos(yaw), v * math.sin(yaw), 1.0)
        if EGO_ID in sim.simulation.getCollidingVehiclesIDList():
            collisions += 1
        event.control(ctx, k)
        if k < steps - 1:
            sim.simulationStep()
    remaining = ctx.remaining_route(EGO_ID)
    agents = []
    for vid, tr in tracks.items():  # insertion order = first appearance: deterministic
        d = tr["data"]
        agents.append(
            AgentTrack(vid, tr["vtype"], tr["length"], tr["width"], d[0], d[1], d[2], d[3], d[4], d[5] > 0.5,
                       tr["type"])
        )
    if not event.triggered():
        raise ScenarioRejected("not_triggered", event.setup_failure or "the event never fired")
    return RawRecord(
        steps=steps,
        dt=dt,
        ego_length=ego_len,
        ego_width=ego_wid,
        ego_x=ego[0],
        ego_y=ego[1],
        ego_yaw=ego[2],
        ego_speed=ego[3],
        ego_accel=ego[4],
        ego_lanes=lanes,
        remaining_edges=remaining,
        last_lane=last_lane,
        agents=agents,
        event=event.info(),
        sumo_collisions=collisions,
        signals=signals,
    )
