"""A clip as a CommonRoad scenario with a planning problem (``rad2 data to-commonroad``; no ROS).

Any log rad2 reads (INTERACTION, Argoverse 2, Waymo, nuPlan, a converted NGSIM file, a SUMO scene)
becomes a benchmark problem that ``rad2 eval commonroad`` drives and CommonRoad's own solution checker
judges, so planners can be compared by the community's judge at locations whose CommonRoad files do
not exist:

- **Road.** Each lane of the clip's map becomes a lanelet: its left and right boundaries resampled to
  the same number of points (CommonRoad needs pairs), the centre between them, successors and
  predecessors from the map's successor lists, same-direction neighbours as adjacent lanelets. A lane
  whose boundaries are missing or degenerate is left out and named in the report.
- **Traffic.** Every agent is a dynamic obstacle over its first run of valid steps (position, heading,
  speed along the heading: CommonRoad's recorded-traffic states), with its box; vehicles are cars,
  pedestrians and cyclists keep their kind.
- **Problem.** The clip's ego starts as the problem's initial state at the clip's first step; the goal
  is where the logged driver was ``horizon_s`` later: a box ``goal_length_m`` x ``goal_width_m``
  around its position along its heading, a time window of ``goal_window_s`` ending then, its heading
  within ``goal_heading_rad`` and its speed within ``goal_speed_m_s`` (the shape of the NGSIM problems'
  goals: a small area, a 1 s window, a speed interval 5 m/s wide). The logged ego is not an obstacle.

The files are written under ``out/<source>/`` with a ``ZAM`` country code (CommonRoad's code for
scenarios that are not a published benchmark entry). A dataset's licence binds its exports as it binds
the dataset: INTERACTION's allows evaluation, not redistribution.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

AGENT_VEHICLE, AGENT_PEDESTRIAN, AGENT_CYCLIST = 0, 1, 2


class CommonRoadExportError(ValueError):
    """A clip that cannot become a planning problem; the message names the clip and the reason."""


@dataclass(frozen=True)
class ProblemShape:
    horizon_s: float = 8.0
    goal_window_s: float = 1.0
    goal_length_m: float = 8.0
    goal_width_m: float = 2.5
    goal_heading_rad: float = 0.2
    goal_speed_m_s: float = 2.5  # the goal's speeds: the logged one ± this

    def __post_init__(self):
        for name in ("horizon_s", "goal_window_s", "goal_length_m", "goal_width_m", "goal_heading_rad",
                     "goal_speed_m_s"):
            v = getattr(self, name)
            if not math.isfinite(v) or v <= 0:
                raise CommonRoadExportError(f"{name}: {v!r} must be a finite number > 0")
        if self.goal_window_s >= self.horizon_s:
            raise CommonRoadExportError(f"goal_window_s: {self.goal_window_s!r} must be below horizon_s "
                                        f"({self.horizon_s!r})")


def _resampled(line: np.ndarray, n: int) -> np.ndarray:
    """``line`` [P >= 2, 2] at ``n`` points evenly spaced along its length."""
    seg = np.hypot(*np.diff(line, axis=0).T)
    cum = np.concatenate([[0.0], np.cumsum(seg)])
    s = np.linspace(0.0, cum[-1], n)
    return np.stack([np.interp(s, cum, line[:, 0]), np.interp(s, cum, line[:, 1])], axis=-1)


def lanelet_network(lane_map) -> tuple[Any, list[str]]:
    """(CommonRoad LaneletNetwork, notes on the lanes left out) of a :class:`rad2_core.lane_map.LaneMap`."""
    from commonroad.scenario.lanelet import Lanelet, LaneletNetwork, LaneletType

    ids = [int(i) for i in lane_map.lane_ids]
    cr_id = {lid: k + 1 for k, lid in enumerate(ids)}  # CommonRoad ids: positive, unique among objects
    preds: dict[int, list[int]] = {lid: [] for lid in ids}
    for k, lid in enumerate(ids):
        for s in lane_map.successors[k]:
            if int(s) in preds:
                preds[int(s)].append(lid)
    left_n = lane_map.left_neighbors if len(lane_map.left_neighbors) == len(ids) else None
    right_n = lane_map.right_neighbors if len(lane_map.right_neighbors) == len(ids) else None
    lanelets, notes = [], []
    for k, lid in enumerate(ids):
        left = right = None
        if k < len(lane_map.left_boundaries) and k < len(lane_map.right_boundaries):
            left = np.asarray(lane_map.left_boundaries[k], float)
            right = np.asarray(lane_map.right_boundaries[k], float)
        if (left is None or right is None or len(left) < 2 or len(right) < 2
                or not (np.isfinite(left).all() and np.isfinite(right).all())):
            notes.append(f"lane {lid}: no left and right boundary of 2 or more points; left out")
            continue
        n = max(len(left), len(right), 2)
        lv, rv = _resampled(left, n), _resampled(right, n)
        kwargs: dict[str, Any] = {}
        if left_n is not None and int(left_n[k]) in cr_id:
            kwargs.update(adjacent_left=cr_id[int(left_n[k])], adjacent_left_same_direction=True)
        if right_n is not None and int(right_n[k]) in cr_id:
            kwargs.update(adjacent_right=cr_id[int(right_n[k])], adjacent_right_same_direction=True)
        lanelets.append(Lanelet(lv, 0.5 * (lv + rv), rv, cr_id[lid],
                                predecessor=[cr_id[p] for p in preds[lid]],
                                successor=[cr_id[int(s)] for s in lane_map.successors[k] if int(s) in cr_id],
                                lanelet_type={LaneletType.URBAN}, **kwargs))
    kept = {ll.lanelet_id for ll in lanelets}
    for ll in lanelets:  # references to lanes left out
        ll.predecessor = [p for p in ll.predecessor if p in kept]
        ll.successor = [s for s in ll.successor if s in kept]
        if ll.adj_left is not None and ll.adj_left not in kept:
            ll.adj_left = None
        if ll.adj_right is not None and ll.adj_right not in kept:
            ll.adj_right = None
    if not lanelets:
        raise CommonRoadExportError("the map has no lane with left and right boundaries")
    return LaneletNetwork.create_from_lanelet_list(lanelets), notes


def _agent_state(clip, a: int, t: int, cls):
    """Agent ``a`` at step ``t`` as a CommonRoad state of class ``cls``: position, heading and the speed
    along it (the recorded-traffic scenarios' state)."""
    speed = float(np.hypot(clip.agent_vx[a, t], clip.agent_vy[a, t]))
    return cls(time_step=t, position=np.array([clip.agent_x[a, t], clip.agent_y[a, t]], float),
               orientation=float(clip.agent_yaw[a, t]), velocity=speed)


def _obstacles(clip, first_id: int) -> list:
    from commonroad.geometry.shape import Rectangle
    from commonroad.prediction.prediction import TrajectoryPrediction
    from commonroad.scenario.obstacle import DynamicObstacle, ObstacleType
    from commonroad.scenario.state import CustomState, InitialState
    from commonroad.scenario.trajectory import Trajectory

    kinds = {AGENT_VEHICLE: ObstacleType.CAR, AGENT_PEDESTRIAN: ObstacleType.PEDESTRIAN,
             AGENT_CYCLIST: ObstacleType.BICYCLE}
    out = []
    for a in range(clip.num_agents):
        valid = np.asarray(clip.agent_valid[a], bool)
        if not valid.any():
            continue
        t0 = int(np.argmax(valid))
        stop = t0 + (int(np.argmin(valid[t0:])) if not valid[t0:].all() else len(valid) - t0)
        if stop - t0 < 2:
            continue
        shape = Rectangle(float(clip.agent_length[a]), float(clip.agent_width[a]))
        init = _agent_state(clip, a, t0, InitialState)
        init.acceleration, init.yaw_rate, init.slip_angle = 0.0, 0.0, 0.0
        states = [_agent_state(clip, a, t, CustomState) for t in range(t0 + 1, stop)]
        kind = kinds.get(int(clip.agent_types[a]), ObstacleType.UNKNOWN)
        out.append(DynamicObstacle(first_id + len(out), kind, shape, init,
                                   TrajectoryPrediction(Trajectory(t0 + 1, states), shape)))
    return out


def clip_problem(clip, shape: ProblemShape = ProblemShape()) -> tuple[Any, Any, list[str]]:
    """(Scenario, PlanningProblemSet, notes) of ``clip``: its map, its agents as obstacles, its ego's
    start as the initial state and where the ego was ``shape.horizon_s`` later as the goal."""
    from commonroad.common.util import AngleInterval, Interval
    from commonroad.geometry.shape import Rectangle
    from commonroad.planning.goal import GoalRegion
    from commonroad.planning.planning_problem import PlanningProblem, PlanningProblemSet
    from commonroad.scenario.scenario import Scenario, ScenarioID
    from commonroad.scenario.state import CustomState, InitialState

    dt = float(clip.dt)
    end = int(round(shape.horizon_s / dt))
    if clip.num_steps <= end:
        raise CommonRoadExportError(f"clip {clip.clip_id}: {clip.num_steps} steps of {dt:g} s, the problem "
                                    f"needs {end + 1} (horizon_s {shape.horizon_s:g})")
    x, y, yaw, v = (np.asarray(a, float) for a in (clip.ego_x, clip.ego_y, clip.ego_yaw, clip.ego_speed))
    if not all(np.isfinite(a[: end + 1]).all() for a in (x, y, yaw, v)):
        raise CommonRoadExportError(f"clip {clip.clip_id}: the ego's track is not finite within the horizon")
    name = "".join(ch for ch in str(clip.clip_id).title() if ch.isalnum())[:60] or "Clip"
    scenario = Scenario(dt, ScenarioID(country_id="ZAM", map_name=name, map_id=1))
    network, notes = lanelet_network(clip.map)
    scenario.add_objects(network)
    scenario.add_objects(_obstacles(clip, first_id=max(ll.lanelet_id for ll in network.lanelets) + 1))
    init = InitialState(position=np.array([x[0], y[0]]), orientation=float(yaw[0]), velocity=float(v[0]),
                        time_step=0, yaw_rate=0.0, slip_angle=0.0, acceleration=0.0)
    window = max(1, int(round(shape.goal_window_s / dt)))
    goal_state = CustomState(
        position=Rectangle(shape.goal_length_m, shape.goal_width_m, center=np.array([x[end], y[end]]),
                           orientation=float(yaw[end])),
        time_step=Interval(end - window, end),
        orientation=AngleInterval(float(yaw[end]) - shape.goal_heading_rad,
                                  float(yaw[end]) + shape.goal_heading_rad),
        velocity=Interval(max(0.0, float(v[end]) - shape.goal_speed_m_s),
                          float(v[end]) + shape.goal_speed_m_s))
    pset = PlanningProblemSet()
    pset.add_planning_problem(PlanningProblem(scenario.generate_object_id(), init, GoalRegion([goal_state])))
    return scenario, pset, notes


def write_problem(scenario, pset, path: Path, source: str) -> Path:
    """Write a scenario and its problems as CommonRoad XML at ``path`` (replacing a file there)."""
    from commonroad.common.writer.file_writer_interface import OverwriteExistingFile
    from commonroad.common.writer.file_writer_xml import XMLFileWriter

    path.parent.mkdir(parents=True, exist_ok=True)
    XMLFileWriter(scenario, pset, author="rad2 data to-commonroad", affiliation="rad2",
                  source=source, tags=set()).write_to_file(str(path), OverwriteExistingFile.ALWAYS)
    return path
