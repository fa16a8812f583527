"""The CommonRoad benchmark: planning problems of CommonRoad scenarios driven closed loop, judged by the
official CommonRoad solution checker (``rad2 eval commonroad``).

For each planning problem of a scenario the ego starts at the problem's initial state; the scenario's
obstacles stay obstacles on their recorded trajectories (no logged vehicle is promoted). The route to
the goal region comes from ``commonroad-route-planner``. The learned planner and the reference policies
drive in the BEV-Warp simulator (:class:`bev_warp_sim.simulator.Simulator`: planner, iLQR, kinematic
bicycle), through a clip built here from the scenario and the problem (:func:`problem_clip`), until the
goal region is reached, the problem's time window ends or the simulator ends the episode (collision,
leaving the road). ``commonroad-reactive-planner`` drives the same problems in its own replanning loop.

Each drive becomes a CommonRoad solution (KS model, :data:`VEHICLE_TYPE_NAME`) and is judged with
``commonroad_dc.feasibility.solution_checker`` (``valid_solution`` and each of its checks on its own)
and scored with ``commonroad_dc.costs.evaluation.CostFunctionEvaluator``, independently of rad2's own
metrics. Where rad2's collision or off-road verdict and the judge's differ, the drive is counted and
explained (:func:`explain_disagreement`).

**Poses.** The simulator's bicycle carries the box centre, ``vehicle.rear_axle_to_center`` ahead of the
rear axle; CommonRoad's KS state carries the point ``b`` (the benchmark vehicle's rear axle to centre of
gravity) ahead of the rear axle, with the rear axle's speed. The two share the rear axle
(:func:`ks_states`): the drive starts exactly at the problem's initial state.

**Vehicle type.** :data:`VEHICLE_TYPE_NAME` is BMW_320i (KS2: 4.508 x 1.61 m, wheelbase 2.58 m). The
box closest to params/vehicle.yaml's 4.8 x 1.9 m (wheelbase 2.9 m) is VW_VANAGON's (4.569 x 1.844 m,
2.47 m; FORD_ESCORT: 4.298 x 1.674 m, 2.39 m), but the NGSIM problems start their ego where a recorded
driver was, some of them close to the road's edge: at its initial state the VW_VANAGON box already
crosses the road boundary in 3 of the 30 problems of the test split and fixtures (no solution could be
valid), the BMW_320i box in none. BMW_320i is also the reactive planner's default vehicle, so every
planner is judged with one vehicle. The judge's box is 0.29 m shorter and 0.29 m narrower than the box
rad2's simulator checks.

**Protobuf.** commonroad-io 2024.x ships protobuf modules generated for protobuf 3.20; rad2 pins
protobuf 7 (the Waymo reader's runtime), under which they only load with protobuf's pure-Python
implementation. rad2's CommonRoad reader avoids them (XML reader only); the reactive planner imports
them, so :func:`use_python_protobuf` selects that implementation for a benchmark process before
protobuf is first imported.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

# the benchmark vehicle of the solutions rad2's planners write (see the module docstring)
VEHICLE_TYPE_NAME = "BMW_320i"
COST_FUNCTION_DEFAULT = "SM1"
# an obstacle whose box sits this close to the problem's initial state (centre and heading) is the
# recorded ego kept in the scenario, not traffic the ego starts inside of
RECORDED_EGO_MAX_OFFSET_M = 1.0
RECORDED_EGO_MAX_HEADING_RAD = 0.35
# the pseudo-log ego track (the clip's ego: only the start and the progress reference come from it)
# blends the initial pose's lateral offset and heading into the route over this many steps
TRACK_BLEND_STEPS = 30
# route continued along successors past the route planner's last lanelet (the goal region may end it)
ROUTE_EXTENSION_M = 60.0
PLANNERS = ("rad2", "pdm_closed", "idm", "reactive")
SIM_POLICIES = {"rad2": "rad2", "pdm_closed": "pdm_closed", "idm": "idm"}


@dataclass
class Problem:
    """One planning problem of one scenario file (a ready one carries its clip, a bad one the reason)."""

    source: str  # US101 | Lankershim | fixtures | the folder's name
    path: str
    scenario_id: str
    problem_id: int | None
    bad: str | None = None
    scenario: Any = None
    problem_set: Any = None
    problem: Any = None
    clip: Any = None
    route_lanes: list[int] = field(default_factory=list)
    reference_path: np.ndarray | None = None
    start_offset_m: float = 0.0  # rad2's box centre ahead of the CommonRoad position (m)

    @property
    def key(self) -> str:
        return f"{self.scenario_id}:{self.problem_id}"

    def describe(self) -> str:
        where = Path(self.path).name
        if self.problem_id is not None:
            where += f" problem {self.problem_id}"
        return f"{where}: {self.bad}" if self.bad else where


# ----------------------------------------------------------------------------------------------------
# environment


def use_python_protobuf() -> bool:
    """Select protobuf's pure-Python implementation for this process when protobuf is not imported yet
    (commonroad-io 2024's generated modules load only there under protobuf 7); True when it is in use."""
    if "google.protobuf" not in sys.modules:
        os.environ.setdefault("PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION", "python")
    try:
        from google.protobuf.internal import api_implementation
    except ImportError:
        return False
    return api_implementation.Type() == "python"


def vehicle_type():
    from commonroad.common.solution import VehicleType

    return VehicleType[VEHICLE_TYPE_NAME]


def vehicle_parameters(vtype=None):
    from commonroad_dc.feasibility.vehicle_dynamics import VehicleParameterMapping

    return VehicleParameterMapping.from_vehicle_type(vtype if vtype is not None else vehicle_type())


def source_of(path: str | Path) -> str:
    parts = Path(path).resolve().parts
    if any("fixture" in p for p in parts):
        return "fixtures"
    return Path(path).resolve().parent.name


def scenario_files(items: Sequence[str | Path], corpus_root: str | Path | None = None) -> list[Path]:
    """The XML files of ``items``: folders (their ``*.xml``, subfolders included: an unpacked scenario
    collection nests them), XML files, and split lists (``.txt``, one path a line relative to
    ``corpus_root``, default the list's folder). A missing path is an error."""
    out: list[Path] = []
    for item in items:
        p = Path(item)
        if p.is_dir():
            out += sorted(p.rglob("*.xml"))
        elif p.suffix == ".txt" and p.is_file():
            root = Path(corpus_root) if corpus_root else p.parent
            out += [root / line.strip() for line in p.read_text().splitlines()
                    if line.strip() and not line.startswith("#")]
        elif p.exists() or p.suffix == ".xml":
            out.append(p)
        else:
            raise FileNotFoundError(f"--scenarios: {p} is neither a folder, an XML file nor a split list")
    return list(dict.fromkeys(out))


# ----------------------------------------------------------------------------------------------------
# problems: checks, route, clip


def _shapely(shape):
    from shapely.geometry import Polygon as ShapelyPolygon
    from shapely.ops import unary_union

    if hasattr(shape, "shapes"):  # ShapeGroup
        return unary_union([_shapely(s) for s in shape.shapes])
    if hasattr(shape, "shapely_object"):
        return shape.shapely_object
    return ShapelyPolygon(np.asarray(shape.vertices))


def road_area(scenario):
    from shapely.ops import unary_union

    return unary_union([ll.polygon.shapely_object.buffer(0) for ll in scenario.lanelet_network.lanelets])


def _box(x: float, y: float, yaw: float, length: float, width: float):
    from rad2_core.geometry import box_corners
    from shapely.geometry import Polygon as ShapelyPolygon

    return ShapelyPolygon(box_corners(x, y, yaw, length, width))


def obstacle_polygon(obstacle, time_step: int):
    """The obstacle's occupancy at ``time_step`` as a shapely polygon (None where it is not there)."""
    occ = obstacle.occupancy_at_time(int(time_step))
    return None if occ is None else _shapely(occ.shape)


def boundary_checker(scenario):
    """The judge's road-boundary collision checker of ``scenario`` (built once per scenario)."""
    from commonroad_dc.feasibility.solution_checker import _construct_boundary_checker

    cached = getattr(scenario, "_rad2_boundary_checker", None)
    if cached is None:
        cached = _construct_boundary_checker(scenario)
        scenario._rad2_boundary_checker = cached
    return cached


def _judge_box(position, orientation: float, vp):
    from commonroad_dc import pycrcc

    return pycrcc.RectOBB(float(vp.l) / 2, float(vp.w) / 2, float(orientation), float(position[0]),
                          float(position[1]))


def why_bad(scenario, problem, params: dict[str, Any], road=None) -> str | None:
    """Why ``problem`` cannot be benchmarked (None: it can): a goal region off the map, an initial state
    off the map or across the road boundary (the judge's check with the benchmark vehicle), the
    recorded ego kept as an obstacle at the initial state, or an initial state that already collides
    with an obstacle (rad2's box)."""
    road = road_area(scenario) if road is None else road
    init = problem.initial_state
    for k, g in enumerate(problem.goal.state_list):
        pos = getattr(g, "position", None)
        if pos is None:
            continue
        try:
            area = _shapely(pos)
        except Exception as exc:  # noqa: BLE001 - a shape commonroad-io could read but not draw
            return f"goal state {k}: unreadable position ({type(exc).__name__}: {exc})"
        if not area.intersects(road):
            c = area.centroid
            return (f"goal region {k} is off the map (its centre ({c.x:.1f}, {c.y:.1f}) is "
                    f"{area.distance(road):.1f} m from the nearest lanelet)")
    from shapely.geometry import Point

    p0 = np.asarray(init.position, float)
    if not road.buffer(0.5).contains(Point(p0)):
        return f"initial state ({p0[0]:.1f}, {p0[1]:.1f}) is off the map"
    vp = vehicle_parameters()
    if boundary_checker(scenario).collide(_judge_box(p0, float(init.orientation), vp)):
        return (f"the initial state already crosses the road boundary with the benchmark vehicle's "
                f"{vp.l} x {vp.w} m box (the judge's boundary check): no solution can be valid")
    veh = params["vehicle"]
    ego = _box(p0[0], p0[1], float(init.orientation), float(veh["length"]), float(veh["width"]))
    t0 = int(init.time_step)
    for o in scenario.obstacles:
        poly = obstacle_polygon(o, t0)
        if poly is None or not poly.intersects(ego):
            continue
        state = o.state_at_time(t0) if hasattr(o, "state_at_time") else o.initial_state
        state = state if state is not None else o.initial_state
        offset = float(np.hypot(*(np.asarray(state.position, float) - p0)))
        dyaw = abs(float(np.angle(np.exp(1j * (float(state.orientation) - float(init.orientation))))))
        if offset <= RECORDED_EGO_MAX_OFFSET_M and dyaw <= RECORDED_EGO_MAX_HEADING_RAD:
            return (f"the recorded ego is kept as obstacle {o.obstacle_id} at the initial state "
                    f"({offset:.2f} m, {dyaw:.2f} rad from it): remove it from the scenario")
        return (f"the initial state already collides with obstacle {o.obstacle_id} at time step {t0} "
                f"(overlap {poly.intersection(ego).area:.2f} m²)")
    return None


def plan_route(scenario, problem) -> tuple[list[int], np.ndarray]:
    """(lanelet ids, reference path) from commonroad-route-planner: the shortest route with the fewest
    lane changes to the goal (a survival route where the goal has no position)."""
    import logging

    from commonroad_route_planner.reference_path_planner import ReferencePathPlanner
    from commonroad_route_planner.route_planner import RoutePlanner

    routes = RoutePlanner(scenario.lanelet_network, problem, logging_level=logging.ERROR).plan_routes()
    ref = ReferencePathPlanner(lanelet_network=scenario.lanelet_network, planning_problem=problem,
                               routes=routes, logging_level=logging.ERROR).plan_shortest_reference_path(
        retrieve_shortest=True, consider_least_lance_changes=True)
    return [int(i) for i in ref.lanelet_ids], np.asarray(ref.reference_path, float)


def _extend_lanes(lane_map, lanes: list[int], extension_m: float) -> list[int]:
    """``lanes`` continued along the straightest successors for ``extension_m`` (or the map's end)."""
    from rad2_core.geometry import wrap_angle

    index = lane_map.lane_index()
    out = list(lanes)
    added = 0.0
    while added < extension_m and len(out) < len(lanes) + 50:
        i = index[out[-1]]
        succ = [int(s) for s in lane_map.successors[i] if int(s) in index and int(s) not in out]
        if not succ:
            break
        end = lane_map.centerlines[i]
        heading = math.atan2(*(end[-1] - end[-2])[::-1]) if len(end) > 1 else 0.0

        def turn(lid: int, ref: float = heading) -> float:
            cl = lane_map.centerlines[index[lid]]
            h = math.atan2(*(cl[min(1, len(cl) - 1)] - cl[0])[::-1]) if len(cl) > 1 else ref
            return abs(float(wrap_angle(h - ref)))

        nxt = min(succ, key=turn)
        cl = lane_map.centerlines[index[nxt]]
        added += float(np.sum(np.hypot(*np.diff(cl, axis=0).T))) if len(cl) > 1 else 0.0
        out.append(nxt)
    return out


def _route_geometry(lane_map, lanes: list[int], reference_path: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(route lane ids, route polyline) of rad2's clip: the planner's lanes as rad2 chains them (lane
    changes blended), continued past the goal; the reference path where the lanes do not chain."""
    from rad2_datasets.adapters import route_polyline

    lanes = _extend_lanes(lane_map, lanes, ROUTE_EXTENSION_M)
    try:
        return np.asarray(lanes, np.int64), route_polyline(lane_map, lanes)
    except (KeyError, ValueError):
        return np.asarray(lanes, np.int64), np.asarray(reference_path, float)


def _along(poly: np.ndarray, s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Points and headings at arc lengths ``s`` of polyline ``poly`` (clamped to it)."""
    seg = np.diff(poly, axis=0)
    cum = np.concatenate([[0.0], np.cumsum(np.hypot(seg[:, 0], seg[:, 1]))])
    s = np.clip(s, 0.0, cum[-1])
    i = np.clip(np.searchsorted(cum, s, side="right") - 1, 0, len(seg) - 1)
    frac = (s - cum[i]) / np.maximum(cum[i + 1] - cum[i], 1e-9)
    pts = poly[i] + frac[:, None] * seg[i]
    return pts, np.arctan2(seg[i, 1], seg[i, 0])


def _project(poly: np.ndarray, p: np.ndarray) -> tuple[float, float]:
    """(arc length, signed lateral offset) of point ``p`` on polyline ``poly``."""
    seg = np.diff(poly, axis=0)
    ln2 = np.maximum((seg ** 2).sum(1), 1e-12)
    u = np.clip(((p - poly[:-1]) * seg).sum(1) / ln2, 0.0, 1.0)
    foot = poly[:-1] + u[:, None] * seg
    d = np.hypot(*(p - foot).T)
    k = int(np.argmin(d))
    cum = np.concatenate([[0.0], np.cumsum(np.sqrt(ln2))])
    cross = seg[k, 0] * (p[1] - poly[k, 1]) - seg[k, 1] * (p[0] - poly[k, 0])
    return float(cum[k] + u[k] * np.sqrt(ln2[k])), float(np.sign(cross) * d[k])


def goal_time_end(problem) -> int:
    ends = [int(g.time_step.end) for g in problem.goal.state_list
            if getattr(g, "time_step", None) is not None]
    return max(ends) if ends else int(problem.initial_state.time_step) + 100


def _goal_centre(position) -> np.ndarray | None:
    """The centre of a goal state's position (a shape, or a group of shapes), None without one."""
    if position is None:
        return None
    centre = getattr(position, "center", None)
    if centre is not None:
        return np.asarray(centre, float)
    shapes = getattr(position, "shapes", None)
    if shapes:
        centres = [c for c in (_goal_centre(sh) for sh in shapes) if c is not None]
        return np.mean(centres, axis=0) if centres else None
    return None


def goal_pace(item: Problem, params: dict[str, Any], dt: float) -> Callable | None:
    """The planning problem's mission speed for rad2 (:func:`rad2_planner.mission_pace.arrival_speed`):
    ``(sim, state, rows) -> [m/s]``, the pace that brings the ego's reference point along the route to
    the goal region's centre at the middle of its time window, then the goal's speed. None where the
    goal has no position or no time window (the planner drives as it would)."""
    from rad2_planner.mission_pace import MissionPaceParams, arrival_speed

    goal = item.problem.goal.state_list[0]
    centre = _goal_centre(getattr(goal, "position", None))
    window = getattr(goal, "time_step", None)
    if centre is None or window is None:
        return None
    pace = MissionPaceParams.from_params(params)
    speed = getattr(goal, "velocity", None)
    goal_speed = None if speed is None or not hasattr(speed, "start") else (float(speed.start),
                                                                            float(speed.end))
    poly = np.asarray(item.clip.route_polyline, float)
    # the box centre the simulator carries is start_offset_m ahead of the judged reference point
    s_goal = _project(poly, centre)[0] + float(item.start_offset_m)
    t_mid = (0.5 * (float(window.start) + float(window.end)) - int(item.problem.initial_state.time_step)) * dt
    max_speed = float(params["vehicle"]["max_speed"])

    def speeds(sim, state, rows) -> list[float]:
        return [arrival_speed(s_goal - _project(poly, np.asarray(state.ego[b, :2], float))[0],
                              t_mid - float(state.t[b]) * float(sim.dt), goal_speed, max_speed,
                              pace.min_time_s) for b in rows]

    return speeds


def problem_clip(scenario, problem, params: dict[str, Any], lane_map, route_lanes: list[int],
                 reference_path: np.ndarray):
    """The clip of one planning problem: the scenario's map and every obstacle on its recorded
    trajectory, the route to the goal, and as the clip's ego a pseudo-log that starts at the problem's
    initial state (its box centre on the shared rear axle) and goes on along the route at the initial
    speed until the end of the problem's time window. The simulator takes only the start from it (and
    the progress reference of rad2's own metrics); ``sim.warp_max_uncovered`` 0 renders every
    observation at the simulated pose. Returns (clip, start offset in m)."""
    from rad2_core.clip import Clip
    from rad2_core.geometry import wrap_angle
    from rad2_datasets.adapters import accel_from_speed
    from rad2_datasets.adapters.commonroad import obstacle_arrays

    dt = float(scenario.dt)
    init = problem.initial_state
    t0 = int(init.time_step)
    t_end = max(goal_time_end(problem), t0 + 2)
    n = t_end - t0 + 1
    veh = params["vehicle"]
    offset = float(veh["rear_axle_to_center"]) - float(vehicle_parameters().b)
    yaw0 = float(init.orientation)
    p0 = np.asarray(init.position, float) + offset * np.array([math.cos(yaw0), math.sin(yaw0)])
    v0 = max(float(getattr(init, "velocity", 0.0) or 0.0), 0.0)
    route_ids, route_poly = _route_geometry(lane_map, route_lanes, reference_path)
    s0, d0 = _project(route_poly, p0)
    k = np.arange(n)
    pts, heading = _along(route_poly, s0 + v0 * dt * k)
    w = np.clip(1.0 - k / TRACK_BLEND_STEPS, 0.0, 1.0)
    normal = np.stack([-np.sin(heading), np.cos(heading)], -1)
    xy = pts + (w * d0)[:, None] * normal
    yaw = wrap_angle(heading + w * float(wrap_angle(yaw0 - heading[0])))
    xy[0], yaw[0] = p0, float(wrap_angle(yaw0))
    speed = np.full(n, v0)
    if n > 1:
        step = np.hypot(*np.diff(xy, axis=0).T) / dt
        speed[1:] = step
        speed[0] = v0
    others = sorted(scenario.obstacles, key=lambda o: o.obstacle_id)
    ax, ay, ayaw, avx, avy, valid, types, lengths, widths = obstacle_arrays(scenario, others, t0, n)
    keep = valid.any(axis=1)
    idx = np.flatnonzero(keep)
    sid = str(scenario.scenario_id)
    safe = "".join(ch if ch.isalnum() or ch in "_-." else "_" for ch in sid)
    clip = Clip.build(
        clip_id=f"crp_{safe}_pp{problem.planning_problem_id}", dt=dt,
        ego_x=xy[:, 0], ego_y=xy[:, 1], ego_yaw=yaw, ego_speed=speed,
        ego_accel=accel_from_speed(speed, dt), ego_length=float(veh["length"]), ego_width=float(veh["width"]),
        agent_ids=[others[i].obstacle_id for i in idx], agent_types=[types[i] for i in idx],
        agent_length=[lengths[i] for i in idx], agent_width=[widths[i] for i in idx],
        agent_x=ax[keep], agent_y=ay[keep], agent_yaw=ayaw[keep], agent_vx=avx[keep], agent_vy=avy[keep],
        agent_valid=valid[keep], map=lane_map, route_lane_ids=route_ids, route_polyline=route_poly,
        metadata={"source": "commonroad_problem", "scenario_kind": "planning_problem", "seed": None,
                  "network_kind": "real", "scenario_id": sid, "start_time_step": t0,
                  "planning_problem_id": int(problem.planning_problem_id), "promoted_ego": False},
    ).validate()
    return clip.resample(float(params["sim"]["dt"])), offset


def load_problems(files: Sequence[Path], params: dict[str, Any], progress: bool = True) -> list[Problem]:
    """Every planning problem of ``files``, each either ready (with its clip) or ``bad`` with the reason:
    an unreadable file, no planning problem, a goal off the map, no route to the goal, an initial state
    that already collides (or the recorded ego kept there as an obstacle), a clip the simulator refuses."""
    from bev_warp_sim.preflight import refusal
    from bev_warp_sim.simulator import Simulator
    from rad2_datasets.adapters.commonroad import CommonRoadAdapterError, lanelet_map, read_commonroad_file
    from tqdm import tqdm

    sim = Simulator(params)
    out: list[Problem] = []
    for path in tqdm(files, desc="reading scenarios", unit="file", disable=not progress):
        source = source_of(path)
        try:
            scenario, pset = read_commonroad_file(path)
        except CommonRoadAdapterError as exc:
            out.append(Problem(source, str(path), Path(path).stem, None, bad=f"unreadable: {exc}"))
            continue
        sid = str(scenario.scenario_id)
        problems = sorted(pset.planning_problem_dict.values(), key=lambda p: p.planning_problem_id)
        if not problems:
            out.append(Problem(source, str(path), sid, None, bad="the file holds no planning problem"))
            continue
        try:
            lane_map = lanelet_map(scenario, params)
            road = road_area(scenario)
        except Exception as exc:  # noqa: BLE001 - a map the adapter cannot convert, named
            for p in problems:
                out.append(Problem(source, str(path), sid, int(p.planning_problem_id),
                                   bad=f"map not convertible ({type(exc).__name__}: {exc})"))
            continue
        for p in problems:
            item = Problem(source, str(path), sid, int(p.planning_problem_id), scenario=scenario,
                           problem_set=pset, problem=p)
            item.bad = why_bad(scenario, p, params, road)
            if item.bad is None:
                try:
                    item.route_lanes, item.reference_path = plan_route(scenario, p)
                except Exception as exc:  # noqa: BLE001 - the route planner's failures have no common base
                    item.bad = f"no route to the goal ({type(exc).__name__}: {exc})"
            if item.bad is None:
                try:
                    item.clip, item.start_offset_m = problem_clip(scenario, p, params, lane_map,
                                                                  item.route_lanes, item.reference_path)
                    why = refusal(sim, item.clip)
                    if why:
                        item.bad = f"the simulator refuses its clip: {why}"
                except Exception as exc:  # noqa: BLE001 - clip validation and route errors, named
                    item.bad = f"no clip ({type(exc).__name__}: {exc})"
            out.append(item)
    return out


# ----------------------------------------------------------------------------------------------------
# solutions


def ks_states(track: np.ndarray, t0: int, params: dict[str, Any], yaw_ref: float | None = None) -> list:
    """KS states (CommonRoad's convention for :data:`VEHICLE_TYPE_NAME`) of simulator ego states ``track``
    ``[n, >=5]`` (x, y, yaw, v, delta at the box centre): the same rear axle, its speed, the steering
    angle giving the same path curvature with the benchmark vehicle's wheelbase; time steps from ``t0``;
    orientations continuous, starting within pi of ``yaw_ref`` (the initial state's)."""
    from commonroad.scenario.state import KSState

    veh = params["vehicle"]
    wheelbase, rear = float(veh["wheelbase"]), float(veh["rear_axle_to_center"])
    vp = vehicle_parameters()
    wb_cr = float(vp.a + vp.b)
    yaw = np.unwrap(track[:, 2])
    if yaw_ref is not None:
        yaw = yaw + 2.0 * np.pi * np.round((float(yaw_ref) - yaw[0]) / (2.0 * np.pi))
    delta = track[:, 4]
    beta = np.arctan(rear / wheelbase * np.tan(delta))
    v_rear = track[:, 3] * np.cos(beta)
    delta_cr = np.arctan(wb_cr / wheelbase * np.tan(delta))
    shift = float(vp.b) - rear
    pos = track[:, :2] + shift * np.stack([np.cos(yaw), np.sin(yaw)], -1)
    return [KSState(position=pos[i].copy(), steering_angle=float(delta_cr[i]), velocity=float(v_rear[i]),
                    orientation=float(yaw[i]), time_step=int(t0 + i)) for i in range(len(track))]


def cost_function_of(scenario, default: str = COST_FUNCTION_DEFAULT):
    """The cost function named in the scenario's benchmark ID (``KS2:SM1:...``), else ``default``."""
    from commonroad.common.solution import CostFunction

    for part in str(scenario.scenario_id).split(":"):
        if part in CostFunction.__members__:
            return CostFunction[part]
    return CostFunction[default]


def make_solution(scenario, problem_id: int, states: list, vtype=None, cost_function=None,
                  computation_time: float | None = None):
    from commonroad.common.solution import PlanningProblemSolution, Solution, VehicleModel
    from commonroad.scenario.trajectory import Trajectory

    pps = PlanningProblemSolution(
        planning_problem_id=int(problem_id), vehicle_model=VehicleModel.KS,
        vehicle_type=vtype if vtype is not None else vehicle_type(),
        cost_function=cost_function if cost_function is not None else cost_function_of(scenario),
        trajectory=Trajectory(initial_time_step=int(states[0].time_step), state_list=states))
    return Solution(scenario.scenario_id, [pps], computation_time=computation_time)


def write_solution(solution, path: Path) -> Path:
    from commonroad.common.solution import CommonRoadSolutionWriter

    path.parent.mkdir(parents=True, exist_ok=True)
    CommonRoadSolutionWriter(solution).write_to_file(output_path=str(path.parent), filename=path.name,
                                                     overwrite=True)
    return path


# ----------------------------------------------------------------------------------------------------
# the official judge


def _why(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def judge(scenario, problem, solution) -> dict[str, Any]:
    """The CommonRoad solution checker's verdicts on a one-problem ``solution`` and the cost function's
    total: ``valid`` (``valid_solution``), and on their own ``goal_reached``, ``collision_free``
    (obstacles), ``on_road`` (road boundary), ``feasible`` (KS state transitions), ``starts_ok``; each
    failing check's message in ``reasons``. A check that raises something other than its verdict
    exception counts as failed, with its message."""
    from commonroad.planning.planning_problem import PlanningProblemSet
    from commonroad_dc.costs.evaluation import CostFunctionEvaluator
    from commonroad_dc.feasibility import solution_checker as sc

    pset = PlanningProblemSet([problem])
    out: dict[str, Any] = {"reasons": {}}
    t = time.perf_counter()

    def verdict(name: str, fn: Callable[[], bool]) -> None:
        try:
            out[name] = bool(fn())
        except Exception as exc:  # noqa: BLE001 - the checker signals a failed check by raising
            out[name] = False
            out["reasons"][name] = _why(exc)

    verdict("goal_reached", lambda: sc.goal_reached(scenario, pset, solution))
    verdict("starts_ok", lambda: sc.starts_at_correct_state(solution, pset))
    verdict("collision_free", lambda: not sc.obstacle_collision(scenario, pset, solution))
    verdict("on_road", lambda: not sc.boundary_collision(scenario, pset, solution))
    feas: dict[str, Any] = {}

    def feasible() -> bool:
        res = sc.solution_feasible(solution, scenario.dt, pset)
        feas["res"] = res
        return all(r[0] for r in res.values())

    verdict("feasible", feasible)
    verdict("valid", lambda: sc.valid_solution(scenario, pset, solution)[0])
    pps = solution.planning_problem_solutions[0]
    try:
        ev = CostFunctionEvaluator(pps.cost_function, pps.vehicle_type)
        out["cost"] = float(ev.evaluate_pp_solution(scenario, problem, pps.trajectory).total_costs)
    except Exception as exc:  # noqa: BLE001 - the evaluator's failures (route matching) have no common base
        out["cost"] = float("nan")
        out["reasons"]["cost"] = _why(exc)
    out["solved"] = bool(out["valid"] and out["goal_reached"])
    out["judge_s"] = time.perf_counter() - t
    return out


def first_collision_step(scenario, states: list, length: float,
                         width: float) -> tuple[int | None, int | None, float]:
    """(time step, obstacle id, overlap m²) of the first state whose box (centred at the state's
    position) overlaps a scenario obstacle, by exact polygon intersection; (None, None, 0) when none."""
    for s in states:
        ego = _box(s.position[0], s.position[1], s.orientation, length, width)
        for o in scenario.obstacles:
            poly = obstacle_polygon(o, s.time_step)
            if poly is not None and poly.intersects(ego):
                return int(s.time_step), int(o.obstacle_id), float(poly.intersection(ego).area)
    return None, None, 0.0


def explain_disagreement(problem: Problem, states: list, rad2_collided: bool, rad2_offroad: bool,
                         verdict: dict[str, Any], params: dict[str, Any], reactive_agents: bool) -> list[str]:
    """Where rad2's verdict and the judge's differ, which is right, found by exact polygon geometry:
    the judge's box (the benchmark vehicle at the CommonRoad position) and rad2's (params/vehicle.yaml
    at the simulator's centre) against the recorded obstacles; for the road, the box and its centre
    against the lanelets' union."""
    notes = []
    vp = vehicle_parameters()
    veh = params["vehicle"]
    scenario = problem.scenario
    if rad2_collided == verdict.get("collision_free", True):
        judge_hit = first_collision_step(scenario, states, float(vp.l), float(vp.w))
        rad2_states = [_shifted(s, problem.start_offset_m) for s in states]
        rad2_hit = first_collision_step(scenario, rad2_states, float(veh["length"]), float(veh["width"]))
        if reactive_agents and rad2_hit[0] is not None and not rad2_collided:
            why = "rad2's agents were reactive (they yielded); the judge replays the recorded obstacles"
        elif rad2_hit[0] is not None and judge_hit[0] is None:
            why = (f"rad2's {veh['length']} x {veh['width']} m box overlaps obstacle {rad2_hit[1]} at "
                   f"time step {rad2_hit[0]} ({rad2_hit[2]:.2f} m²); the benchmark vehicle's "
                   f"{vp.l} x {vp.w} m box does not: both right for their own box")
        elif judge_hit[0] is not None and rad2_hit[0] is None:
            why = (f"the benchmark box overlaps obstacle {judge_hit[1]} at time step {judge_hit[0]} "
                   f"({judge_hit[2]:.2f} m²) and rad2's does not")
        elif judge_hit[0] is not None:
            right = "judge" if not verdict.get("collision_free") else "rad2"
            why = (f"exact geometry finds an overlap with obstacle {judge_hit[1]} at time step {judge_hit[0]}"
                   f" ({judge_hit[2]:.2f} m²): the {right} is right")
        else:
            why = ("exact geometry finds no overlap for either box: the "
                   f"{'judge' if verdict.get('collision_free') else 'rad2 simulator'} is right")
        notes.append(f"collision: rad2 {'collided' if rad2_collided else 'none'}, judge "
                     f"{'none' if verdict.get('collision_free') else 'collided'}; {why}")
    if rad2_offroad == verdict.get("on_road", True):
        from shapely.geometry import Point

        road = road_area(scenario)
        cc = boundary_checker(scenario)
        judge_steps = [int(s.time_step) for s in states
                       if cc.collide(_judge_box(s.position, s.orientation, vp))]
        worst_box, worst_centre, at = 0.0, 0.0, None
        for s in states:
            box = _box(s.position[0], s.position[1], s.orientation, float(vp.l), float(vp.w))
            out_area = box.difference(road).area
            if out_area > worst_box:
                worst_box, at = out_area, int(s.time_step)
            worst_centre = max(worst_centre, road.distance(Point(s.position[0], s.position[1])))
        margin = float(params["sim"]["offroad_margin_m"])
        first = f"first at time step {judge_steps[0]}, {len(judge_steps)} steps" if judge_steps else "no step"
        why = (f"the judge's boundary check hits {first}; exact geometry: at most {worst_box:.2f} m² of "
               f"the benchmark box outside the lanelets (time step {at}), its centre at most "
               f"{worst_centre:.2f} m outside. rad2 checks the box centre against the drivable area with "
               f"a {margin} m margin, the judge the whole box against the road boundary: both right by "
               "their own rule")
        notes.append(f"off-road: rad2 {'off' if rad2_offroad else 'on'}, judge "
                     f"{'on' if verdict.get('on_road') else 'off'}; {why}")
    return notes


def _shifted(state, offset: float):
    """A copy of a CommonRoad state moved ``offset`` m along its heading (rad2's box centre)."""
    from commonroad.scenario.state import KSState

    h = np.array([math.cos(state.orientation), math.sin(state.orientation)])
    return KSState(position=np.asarray(state.position, float) + offset * h, steering_angle=0.0,
                   velocity=float(state.velocity), orientation=float(state.orientation),
                   time_step=int(state.time_step))


# ----------------------------------------------------------------------------------------------------
# drivers


@dataclass
class Drive:
    """One planner's drive of one problem."""

    planner: str
    states: list  # CommonRoad KS states, one per time step from the initial one
    plan_times_s: list[float]
    wall_s: float
    termination: str  # goal | time_window | collision | offroad | route_end | planner_failed | ...
    rad2_collided: bool | None = None  # the BEV-Warp simulator's own verdicts (None: not simulated)
    rad2_offroad: bool | None = None
    rad2_collisions: list = field(default_factory=list)
    track: np.ndarray | None = None  # simulator ego track (for GIFs)
    note: str = ""


def simulate_problem(item: Problem, sim, decider, params: dict[str, Any], planner: str, group: int = 0,
                     seed: int = 0, h_reuse: int | None = None) -> Drive:
    """Drive ``item``'s clip in the BEV-Warp simulator with ``decider`` (one row) until the goal region
    is reached, the time window ends, or the simulator ends the episode."""
    from bev_warp_sim.rollout import RowSpec, decision_seed

    t_start = time.perf_counter()
    clip = item.clip
    t0 = int(item.problem.initial_state.time_step)
    goal = item.problem.goal
    yaw0 = float(item.problem.initial_state.orientation)
    row = RowSpec(clip, 0, group, 0)
    state = sim.init([clip], [0])
    if hasattr(decider, "mission_speeds"):  # rad2 takes the problem's pace as its mission speed
        decider.mission_speeds = goal_pace(item, params, float(item.scenario.dt))
    decider.start_chunk(sim, state, [row], [decision_seed(seed, group, 0, 0)])
    plan_times: list[float] = []
    n_dec = 0
    termination = ""
    while not state.done[0]:
        if sim.needs_decision(state)[0]:
            obs = sim.observe(state, np.array([0]))
            t = time.perf_counter()
            plans = decider.decide(sim, state, np.array([0]), obs, [decision_seed(seed, group, 0, n_dec)])
            plan_times.append(time.perf_counter() - t)
            state = sim.commit(state, {0: plans[0]}, h_reuse=h_reuse)
            n_dec += 1
        state, _ = sim.step(state)
        k = int(state.t[0])
        last = ks_states(np.asarray(state.ego[:1]), t0 + k, params, yaw0)[0]
        if not state.collided[0] and goal.is_reached(last):
            termination = "goal"
            break
    track = state.ego_track(0)
    states = ks_states(track, t0, params, yaw0)
    if not termination:
        term = state.termination[0]
        termination = "time_window" if term in ("clip_end", "max_steps") else term
    return Drive(planner=planner, states=states, plan_times_s=plan_times,
                 wall_s=time.perf_counter() - t_start, termination=termination,
                 rad2_collided=bool(state.collided[0]), rad2_offroad=bool(state.offroad[0]),
                 rad2_collisions=list(state.collisions[0]), track=track)


class DomainSafeCoordinateSystem:
    """The reactive planner's curvilinear coordinate system (its ``create_coordinate_system``: the
    reference path smoothed and resampled as the planner's defaults say) with the two conversions
    answering outside the projection domain as the planner expects: None from the Cartesian one,
    ValueError from the curvilinear one. commonroad-clcs 2025 raises its own projection-domain
    exceptions there (``CurvilinearProjectionDomainLongitudinalError`` and its siblings), which the
    planner 2025.1 does not catch; everything else is the wrapped object's. Two more mismatches of the
    planner 2025.1 with commonroad-clcs 2025.2 are avoided by building it so: the planner's own
    ``set_reference_path(reference_path=...)`` passes no CLCS parameters, which commonroad-clcs 2025.2
    refuses (AttributeError on None)."""

    def __init__(self, reference_path: np.ndarray):
        from commonroad_clcs import pycrccosy
        from commonroad_rp.utility.utils_coordinate_system import create_coordinate_system

        self._inner = create_coordinate_system(np.asarray(reference_path, float))
        self.domain_errors = 0  # conversions answered for the planner outside the projection domain
        self._domain = (pycrccosy.CartesianProjectionDomainError,
                        pycrccosy.CurvilinearProjectionDomainLateralError,
                        pycrccosy.CurvilinearProjectionDomainLongitudinalError)

    def __getattr__(self, name: str):
        return getattr(self._inner, name)

    def convert_to_cartesian_coords(self, s, d):
        try:
            return self._inner.convert_to_cartesian_coords(s, d)
        except self._domain:
            self.domain_errors += 1
            return None

    def convert_to_curvilinear_coords(self, x, y):
        try:
            return self._inner.convert_to_curvilinear_coords(x, y)
        except self._domain as exc:
            self.domain_errors += 1
            raise ValueError(str(exc)) from exc


def reactive_problem(item: Problem) -> Drive:
    """``commonroad-reactive-planner`` with its default configuration (kinematics checked in this
    process) on ``item``, in the replanning
    loop of its own run script (plan every ``replanning_frequency`` steps, follow the plan between),
    on the same reference path as the other planners, until its goal check passes, the time window
    ends or it finds no trajectory."""
    import logging
    from copy import deepcopy

    from commonroad.scenario.state import KSState
    from commonroad_rp.reactive_planner import ReactivePlanner
    from commonroad_rp.utility.config import ReactivePlannerConfiguration
    from commonroad_rp.utility.evaluation import create_full_solution_trajectory

    logging.getLogger("RP_LOGGER").setLevel(logging.ERROR)
    t_start = time.perf_counter()
    config = ReactivePlannerConfiguration()
    # its default checks the sampled trajectories' kinematics in 6 forked processes; one process here
    # (the benchmark runs in one process on a shared machine): the same trajectories, checked in order
    config.debug.multiproc = False
    config.update(scenario=item.scenario, planning_problem=deepcopy(item.problem))
    planner = ReactivePlanner(config)
    cosys = DomainSafeCoordinateSystem(item.reference_path)
    planner.set_reference_path(coordinate_system=cosys)
    try:
        planner.reset(initial_state_cart=planner.x_0, collision_checker=planner.collision_checker,
                      coordinate_system=planner.coordinate_system)
    except Exception as exc:  # noqa: BLE001 - e.g. an initial state behind the reference path's start
        init = item.problem.initial_state
        state = KSState(position=np.asarray(init.position, float), steering_angle=0.0,
                        velocity=float(init.velocity), orientation=float(init.orientation),
                        time_step=int(init.time_step))
        return Drive(planner="reactive", states=[state], plan_times_s=[],
                     wall_s=time.perf_counter() - t_start, termination="planner_failed",
                     note=f"could not start: {_why(exc)}")
    planner.record_state_and_input(planner.x_0)
    t_last = goal_time_end(item.problem)
    plan_times: list[float] = []
    termination, note, optimal = "", "", None
    freq = int(config.planning.replanning_frequency)
    while True:
        if planner.goal_reached():
            termination = "goal"
            break
        if planner.record_state_list[-1].time_step >= t_last:
            termination = "time_window"
            break
        count = len(planner.record_state_list) - 1
        temp = count % freq
        if temp == 0:
            planner.set_desired_velocity(current_speed=planner.x_0.velocity)
            t = time.perf_counter()
            try:
                optimal = planner.plan()
            except Exception as exc:  # noqa: BLE001 - the planner's own failures end its drive, named
                optimal, note = None, _why(exc)
            plan_times.append(time.perf_counter() - t)
            if not optimal:
                termination = "planner_failed"
                note = note or (f"no trajectory: of {planner.total_count_samples} samples "
                                f"{planner.infeasible_count_kinematics} kinematically infeasible, "
                                f"{planner.infeasible_count_collision} colliding")
                break
        if optimal is None or 1 + temp >= len(optimal[0].state_list):
            termination, note = "planner_failed", note or "plan shorter than the replanning period"
            break
        planner.record_state_and_input(optimal[0].state_list[1 + temp])
        lon = len(optimal) - 2  # (trajectory, lon, lat) in 2025.1; older versions put two more in front
        try:
            planner.reset(initial_state_cart=planner.record_state_list[-1],
                          initial_state_curv=(optimal[lon][1 + temp], optimal[lon + 1][1 + temp]),
                          collision_checker=planner.collision_checker,
                          coordinate_system=planner.coordinate_system)
        except Exception as exc:  # noqa: BLE001 - as above
            termination, note = "planner_failed", _why(exc)
            break
    if cosys.domain_errors:
        note = (note + "; " if note else "") + (f"{cosys.domain_errors} conversions outside the projection "
                                                 "domain answered as the planner expects")
    traj = create_full_solution_trajectory(config, planner.record_state_list)
    states = [KSState(position=np.asarray(s.position, float), steering_angle=float(s.steering_angle),
                      velocity=float(s.velocity), orientation=float(s.orientation),
                      time_step=int(s.time_step)) for s in traj.state_list]
    return Drive(planner="reactive", states=states, plan_times_s=plan_times,
                 wall_s=time.perf_counter() - t_start, termination=termination, note=note)


def reactive_vehicle_type():
    """The reactive planner's default vehicle (its configuration's ``id_type_vehicle``)."""
    from commonroad.common.solution import VehicleType
    from commonroad_rp.utility.config import VehicleConfiguration

    return VehicleType(int(VehicleConfiguration().id_type_vehicle))


# ----------------------------------------------------------------------------------------------------
# the run


@dataclass
class PlannerSpec:
    label: str  # the table's name
    kind: str  # rad2 | pdm_closed | idm | reactive
    checkpoint: str | None = None


def parse_planners(names: Iterable[str], checkpoint: str | None) -> list[PlannerSpec]:
    """``rad2`` (``checkpoint`` or planner.yaml's), ``rad2@DIR`` (a checkpoint directory, labelled by its
    name), ``pdm_closed``, ``idm``, ``reactive``."""
    out = []
    for name in names:
        if name.startswith("rad2@"):
            ckpt = name.split("@", 1)[1]
            out.append(PlannerSpec(f"rad2 ({Path(ckpt).name})", "rad2", ckpt))
        elif name == "rad2":
            label = "rad2" if checkpoint is None else f"rad2 ({Path(checkpoint).name})"
            out.append(PlannerSpec(label, "rad2", checkpoint))
        elif name in PLANNERS:
            out.append(PlannerSpec(name, name))
        else:
            raise ValueError(f"--planners: {name!r} is not one of {', '.join(PLANNERS)} or rad2@DIR")
    return out


def drive_record(item: Problem, drive: Drive, verdict: dict[str, Any], solution_path: Path | None,
                 disagreements: list[str]) -> dict[str, Any]:
    times = np.asarray(drive.plan_times_s, float)
    return {
        "planner": drive.planner, "source": item.source, "scenario": item.scenario_id,
        "problem_id": item.problem_id, "path": item.path, "termination": drive.termination,
        "steps": len(drive.states), "note": drive.note,
        "rad2_collided": drive.rad2_collided, "rad2_offroad": drive.rad2_offroad,
        "rad2_collisions": [{k: (v if isinstance(v, str | int | float | bool) or v is None else str(v))
                             for k, v in dict(c).items()} for c in drive.rad2_collisions],
        "judge": verdict, "disagreements": disagreements,
        "plan_times_ms": [round(1e3 * float(t), 3) for t in times], "wall_s": drive.wall_s,
        "solution": str(solution_path) if solution_path else None,
    }


def run_benchmark(problems: list[Problem], planners: list[PlannerSpec], files: dict, out: Path, *,
                  reactive_agents: bool = False, seed: int = 0, h_reuse: int | None = None,
                  progress: bool = True, log: Callable[[str], None] = print,
                  resume: bool = False) -> list[dict[str, Any]]:
    """Every planner on every ready problem: drive, write the solution, judge. Each finished drive goes to
    ``out/drives.jsonl`` at once; ``resume`` reads the drives there back instead of driving them again."""
    from bev_warp_sim.simulator import Simulator
    from rad2_core.config import merged
    from tqdm import tqdm

    from rad2_evaluation.closed_loop import make_decider

    params = merged(files, *files)
    out.mkdir(parents=True, exist_ok=True)
    jsonl = out / "drives.jsonl"
    done: dict[tuple[str, str], dict] = {}
    if resume and jsonl.is_file():
        for line in jsonl.read_text().splitlines():
            if line.strip():
                r = json.loads(line)
                done[(r["planner"], f"{r['scenario']}:{r['problem_id']}")] = r
    elif jsonl.exists():
        jsonl.unlink()
    ready = [p for p in problems if p.bad is None]
    sim = Simulator(params) if any(s.kind != "reactive" for s in planners) else None
    records: list[dict[str, Any]] = []
    tracks: dict[tuple[str, str], np.ndarray] = {}
    for spec in planners:
        todo = [p for p in ready if (spec.label, p.key) not in done]
        records += [done[(spec.label, p.key)] for p in ready if (spec.label, p.key) in done]
        if not todo:
            continue
        decider = None
        if spec.kind != "reactive":
            kwargs = {"checkpoint_dir": spec.checkpoint} if spec.kind == "rad2" and spec.checkpoint else {}
            decider = make_decider(SIM_POLICIES[spec.kind], params, **kwargs)
        else:
            use_python_protobuf()
        for item in tqdm(todo, desc=spec.label, unit="problem", disable=not progress):
            if spec.kind == "reactive":
                drive = reactive_problem(item)
                vtype = reactive_vehicle_type()
            else:
                drive = simulate_problem(item, sim, decider, params, spec.label, group=ready.index(item),
                                         seed=seed, h_reuse=h_reuse)
                vtype = vehicle_type()
            drive.planner = spec.label
            solution = make_solution(item.scenario, item.problem_id, drive.states, vtype,
                                     computation_time=drive.wall_s)
            safe_label = "".join(ch if ch.isalnum() or ch in "_-." else "_" for ch in spec.label)
            path = write_solution(solution, out / "solutions" / safe_label / f"{item.scenario_id}_"
                                  f"{item.problem_id}.xml")
            verdict = judge(item.scenario, item.problem, solution)
            notes = []
            if drive.rad2_collided is not None:
                notes = explain_disagreement(item, drive.states, drive.rad2_collided,
                                             bool(drive.rad2_offroad), verdict, params, reactive_agents)
            rec = drive_record(item, drive, verdict, path, notes)
            records.append(rec)
            if drive.track is not None:
                tracks[(spec.label, item.key)] = drive.track
            with jsonl.open("a") as fh:
                fh.write(json.dumps(rec, default=_jsonable) + "\n")
        del decider
    run_benchmark.tracks = tracks  # the simulator tracks of this run's drives, for GIFs
    return records


def _jsonable(v):
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, np.ndarray):
        return v.tolist()
    return str(v)


# ----------------------------------------------------------------------------------------------------
# table


COLUMNS = ("problems", "solved %", "collision-free %", "on-road %", "feasible %", "goal reached %",
           "mean cost (all solved)", "plan p50 (ms)", "plan p99 (ms)", "s / problem", "rad2≠judge coll.",
           "rad2≠judge off-road")


def _pct(flags: list[bool]) -> str:
    return f"{100.0 * np.mean(flags):.1f}" if flags else "-"


def summary(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (source, planner) and per planner over all sources: rates of the judge's verdicts,
    the mean cost over the problems every planner of the run solved (within that group), the planning
    time per planning cycle (p50, p99) and the wall time per problem, and the count of drives where
    rad2's collision / off-road verdict differs from the judge's."""
    planners = list(dict.fromkeys(r["planner"] for r in records))
    sources = sorted(dict.fromkeys(r["source"] for r in records))
    rows = []
    for source in [*sources, "all"]:
        mine = [r for r in records if source == "all" or r["source"] == source]
        keys = {p: {(r["scenario"], r["problem_id"]) for r in mine
                    if r["planner"] == p and r["judge"]["solved"]} for p in planners}
        common = set.intersection(*keys.values()) if keys else set()
        for p in planners:
            rs = [r for r in mine if r["planner"] == p]
            if not rs:
                continue
            j = [r["judge"] for r in rs]
            times = np.concatenate([np.asarray(r["plan_times_ms"], float) for r in rs]) if rs else np.zeros(0)
            costs = [r["judge"]["cost"] for r in rs if (r["scenario"], r["problem_id"]) in common]
            simulated = [r for r in rs if r["rad2_collided"] is not None]
            coll = sum(1 for r in simulated if r["rad2_collided"] == r["judge"]["collision_free"])
            off = sum(1 for r in simulated if r["rad2_offroad"] == r["judge"]["on_road"])
            rows.append({
                "source": source, "planner": p, "problems": len(rs),
                "solved %": _pct([x["solved"] for x in j]),
                "collision-free %": _pct([x["collision_free"] for x in j]),
                "on-road %": _pct([x["on_road"] for x in j]),
                "feasible %": _pct([x["feasible"] for x in j]),
                "goal reached %": _pct([x["goal_reached"] for x in j]),
                "mean cost (all solved)": (f"{np.nanmean(costs):.3f} (n={len(costs)})" if costs else
                                           f"- (n={len(common)})"),
                "plan p50 (ms)": f"{np.percentile(times, 50):.1f}" if len(times) else "-",
                "plan p99 (ms)": f"{np.percentile(times, 99):.1f}" if len(times) else "-",
                "s / problem": f"{np.mean([r['wall_s'] for r in rs]):.2f}",
                "rad2≠judge coll.": str(coll) if simulated else "n/a",
                "rad2≠judge off-road": str(off) if simulated else "n/a",
            })
    return rows


def rich_table(rows: list[dict[str, Any]], title: str):
    from rich.table import Table

    table = Table(title=title)
    table.add_column("source")
    table.add_column("planner")
    for c in COLUMNS:
        table.add_column(c, justify="right")
    for r in rows:
        table.add_row(r["source"], r["planner"], *[str(r[c]) for c in COLUMNS])
    return table


def markdown_table(rows: list[dict[str, Any]]) -> str:
    head = "| source | planner | " + " | ".join(COLUMNS) + " |"
    lines = [head, "|" + " --- |" * (2 + len(COLUMNS))]
    for r in rows:
        lines.append(f"| {r['source']} | {r['planner']} | " + " | ".join(str(r[c]) for c in COLUMNS) + " |")
    return "\n".join(lines)


def bad_note(problems: list[Problem]) -> str:
    bad = [p for p in problems if p.bad]
    if not bad:
        return ""
    return "\n".join([f"Skipped {len(bad)} bad input(s):"] + [f"  {p.describe()}" for p in bad])


# ----------------------------------------------------------------------------------------------------
# GIFs


def render_failure_gif(item: Problem, record: dict[str, Any], track: np.ndarray, path: Path, params: dict,
                       stride: int = 2, fps: float = 10.0) -> Path:
    """A small GIF (about 360 x 300 px) of one drive: lanelets, the goal region (green), the recorded
    obstacles (blue), rad2's ego box (red) and its trail; the title names the judge's failed checks."""
    import imageio.v2 as imageio
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Polygon as PolyPatch
    from rad2_core.geometry import box_corners

    scenario, problem = item.scenario, item.problem
    t0 = int(problem.initial_state.time_step)
    veh = params["vehicle"]
    fig, ax = plt.subplots(figsize=(4.5, 3.75), dpi=80)
    for ll in scenario.lanelet_network.lanelets:
        ax.add_patch(PolyPatch(np.asarray(ll.polygon.vertices), closed=True, facecolor="0.9", edgecolor="0.7",
                               lw=0.4, zorder=0))
    for g in problem.goal.state_list:
        pos = getattr(g, "position", None)
        if pos is None:
            continue
        geom = _shapely(pos)
        for poly in getattr(geom, "geoms", [geom]):
            ax.add_patch(PolyPatch(np.asarray(poly.exterior.coords), closed=True, facecolor="tab:green",
                                   alpha=0.3, zorder=1))
    ax.set_aspect("equal")
    ax.tick_params(labelsize=6)
    failed = [k for k in ("goal_reached", "collision_free", "on_road", "feasible")
              if not record["judge"].get(k)]
    frames, dynamic = [], []
    for k in range(0, len(track), max(1, stride)):
        for a in dynamic:
            a.remove()
        dynamic = []
        ts = t0 + k
        for o in scenario.obstacles:
            poly = obstacle_polygon(o, ts)
            if poly is not None and hasattr(poly, "exterior"):
                dynamic.append(ax.add_patch(PolyPatch(np.asarray(poly.exterior.coords), closed=True,
                                                      facecolor="tab:blue", edgecolor="k", lw=0.3, zorder=2)))
        x, y, yaw = track[k, :3]
        corners = box_corners(x, y, yaw, float(veh["length"]), float(veh["width"]))
        dynamic.append(ax.add_patch(PolyPatch(corners, closed=True, facecolor="tab:red", edgecolor="k",
                                              lw=0.5, zorder=3)))
        (trail,) = ax.plot(track[: k + 1, 0], track[: k + 1, 1], color="tab:red", lw=0.8, zorder=3)
        dynamic.append(trail)
        ax.set_xlim(x - 30, x + 30)
        ax.set_ylim(y - 25, y + 25)
        ax.set_title(f"{record['planner']} · {item.scenario_id}\nt={ts} v={track[k, 3]:.1f} m/s · failed: "
                     f"{', '.join(failed) or '-'}", fontsize=7)
        fig.canvas.draw()
        frames.append(np.asarray(fig.canvas.buffer_rgba())[..., :3].copy())
    plt.close(fig)
    path.parent.mkdir(parents=True, exist_ok=True)
    imageio.mimsave(path, frames, duration=stride / fps, loop=0)
    return path
