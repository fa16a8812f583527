"""rad2 eval commonroad (rad2_evaluation.commonroad_benchmark): the official CommonRoad solution checker on a
known-valid and a known-colliding solution of a small scenario built here, and the command's bad inputs
(no planning problem, unreadable XML, a goal region off the map) named, with exit 2 or skipped; and a
scene logged with other state kinds and a lane-polygon goal, read and driven by the shipped planner.

Needs commonroad-io >= 2024 with commonroad-drivability-checker and commonroad-route-planner
(tools/requirements-commonroad.txt); skipped without them. About 15 s."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

try:  # an older commonroad-io beside them fails their imports with more than ImportError
    import commonroad.common.writer.file_writer_xml  # noqa: F401
    import commonroad_dc.feasibility.solution_checker  # noqa: F401
    import commonroad_route_planner.route_planner  # noqa: F401
except Exception as exc:  # noqa: BLE001
    pytest.skip(f"the CommonRoad benchmark's packages are not installed ({type(exc).__name__}: {exc}; "
                "pip install --no-deps -r tools/requirements-commonroad.txt)", allow_module_level=True)

from commonroad.common.util import AngleInterval, Interval  # noqa: E402
from commonroad.geometry.shape import Rectangle  # noqa: E402
from commonroad.planning.goal import GoalRegion  # noqa: E402
from commonroad.planning.planning_problem import PlanningProblem, PlanningProblemSet  # noqa: E402
from commonroad.scenario.lanelet import Lanelet, LaneletNetwork  # noqa: E402
from commonroad.scenario.obstacle import ObstacleType, StaticObstacle  # noqa: E402
from commonroad.scenario.scenario import Scenario, ScenarioID  # noqa: E402
from commonroad.scenario.state import CustomState, InitialState, KSState  # noqa: E402
from rad2_evaluation import commonroad_benchmark as cb  # noqa: E402

SPEED = 10.0
DT = 0.1


def _scenario(name: str, goal_x: float = 70.0, goal_y: float = 0.0, obstacle_at: float | None = None,
              problem: bool = True) -> tuple[Scenario, PlanningProblemSet]:
    """A straight two-lane road along +x (120 m, 3.5 m lanes), the ego at x = 10 in the right lane at
    10 m/s, the goal a rectangle around (goal_x, goal_y) between 5 and 7 s; a parked car at
    ``obstacle_at`` in the ego's lane."""
    x = np.linspace(0.0, 120.0, 25)
    right = Lanelet(np.stack([x, np.full_like(x, 1.75)], 1), np.stack([x, np.zeros_like(x)], 1),
                    np.stack([x, np.full_like(x, -1.75)], 1), 1, adjacent_left=2,
                    adjacent_left_same_direction=True)
    left = Lanelet(np.stack([x, np.full_like(x, 5.25)], 1), np.stack([x, np.full_like(x, 3.5)], 1),
                   np.stack([x, np.full_like(x, 1.75)], 1), 2, adjacent_right=1,
                   adjacent_right_same_direction=True)
    scenario = Scenario(DT, ScenarioID(country_id="ZAM", map_name=name, map_id=1))
    scenario.add_objects(LaneletNetwork.create_from_lanelet_list([right, left]))
    if obstacle_at is not None:
        scenario.add_objects(StaticObstacle(
            scenario.generate_object_id(), ObstacleType.PARKED_VEHICLE, Rectangle(4.5, 1.8),
            InitialState(position=np.array([obstacle_at, 0.0]), orientation=0.0, time_step=0, velocity=0.0)))
    pset = PlanningProblemSet()
    if problem:
        init = InitialState(position=np.array([10.0, 0.0]), orientation=0.0, velocity=SPEED, time_step=0,
                            yaw_rate=0.0, slip_angle=0.0, acceleration=0.0)
        goal = GoalRegion([CustomState(position=Rectangle(12.0, 3.0, center=np.array([goal_x, goal_y])),
                                       time_step=Interval(50, 70), orientation=AngleInterval(-0.3, 0.3))])
        pset.add_planning_problem(PlanningProblem(100, init, goal))
    return scenario, pset


def _write(path: Path, scenario, pset) -> Path:
    from commonroad.common.writer.file_writer_interface import OverwriteExistingFile
    from commonroad.common.writer.file_writer_xml import XMLFileWriter

    XMLFileWriter(scenario, pset, author="rad2 tests", affiliation="rad2", source="synthetic",
                  tags=set()).write_to_file(str(path), OverwriteExistingFile.ALWAYS)
    return path


def _straight_solution(scenario, pset):
    """The ego at constant speed along its lane centre for 7 s: KS states of the benchmark vehicle."""
    states = [KSState(position=np.array([10.0 + SPEED * DT * k, 0.0]), steering_angle=0.0, velocity=SPEED,
                      orientation=0.0, time_step=k) for k in range(71)]
    return cb.make_solution(scenario, 100, states)


def test_the_checker_passes_a_valid_solution_and_fails_a_colliding_one():
    scenario, pset = _scenario("Valid")
    verdict = cb.judge(scenario, pset.planning_problem_dict[100], _straight_solution(scenario, pset))
    assert verdict["valid"] and verdict["solved"], verdict["reasons"]
    assert all(verdict[k] for k in ("goal_reached", "collision_free", "on_road", "feasible"))
    assert np.isfinite(verdict["cost"])

    blocked, bset = _scenario("Blocked", obstacle_at=40.0)
    verdict = cb.judge(blocked, bset.planning_problem_dict[100], _straight_solution(blocked, bset))
    assert not verdict["valid"] and not verdict["solved"]
    assert not verdict["collision_free"] and "collision" in verdict["reasons"]["collision_free"].lower()
    assert verdict["on_road"] and verdict["goal_reached"]  # only the parked car is in the way
    step, obstacle, area = cb.first_collision_step(blocked, _straight_solution(blocked, bset)
                                                   .planning_problem_solutions[0].trajectory.state_list,
                                                   4.508, 1.61)
    assert step is not None and obstacle == blocked.obstacles[0].obstacle_id and area > 0


def test_simulator_states_become_ks_states_on_the_shared_rear_axle():
    from rad2_core.config import load_all, merged

    files = load_all()
    params = merged(files, *files)
    veh = params["vehicle"]
    # a turning car: the KS position is b (BMW_320i) ahead of the rear axle, the rear axle's speed
    track = np.array([[5.0, 2.0, 0.3, 10.0, 0.1], [6.0, 2.3, 0.32, 10.0, 0.1]])
    states = cb.ks_states(track, 7, params, yaw_ref=0.3 + 2 * np.pi)
    vp = cb.vehicle_parameters()
    rear = track[0, :2] - float(veh["rear_axle_to_center"]) * np.array([np.cos(0.3), np.sin(0.3)])
    assert np.allclose(states[0].position, rear + float(vp.b) * np.array([np.cos(0.3), np.sin(0.3)]))
    assert states[0].velocity < 10.0 and states[0].time_step == 7 and states[1].time_step == 8
    assert states[0].orientation == pytest.approx(0.3 + 2 * np.pi)  # continuous from the initial state's


@pytest.fixture()
def bad_inputs(tmp_path):
    folder = tmp_path / "scenarios"
    folder.mkdir()
    _write(folder / "ZAM_NoProblem-1_1_T-1.xml", *_scenario("NoProblem", problem=False))
    _write(folder / "ZAM_GoalOff-1_1_T-1.xml", *_scenario("GoalOff", goal_x=500.0, goal_y=500.0))
    (folder / "ZAM_Broken-1_1_T-1.xml").write_text("<commonRoad><lanelet id='1'>not closed")
    return folder


def test_bad_inputs_are_named_and_stop_the_run(bad_inputs, tmp_path, capsys):
    from rad2_bringup.cli import main

    code = main(["eval", "commonroad", "--scenarios", str(bad_inputs), "--planners", "idm",
                 "--out", str(tmp_path / "out"), "--no-progress"])
    out = capsys.readouterr()
    text = out.out + out.err
    assert code == 2
    assert "ZAM_NoProblem-1_1_T-1.xml: the file holds no planning problem" in text
    assert "ZAM_GoalOff-1_1_T-1.xml problem 100: goal region 0 is off the map" in text
    assert "ZAM_Broken-1_1_T-1.xml: unreadable" in text
    assert "Traceback" not in text
    assert not (tmp_path / "out" / "results.json").exists()


def test_skip_bad_drives_the_good_problem_and_reports_the_bad_ones(bad_inputs, tmp_path, capsys):
    import json

    from rad2_bringup.cli import main

    _write(bad_inputs / "ZAM_Good-1_1_T-1.xml", *_scenario("Good"))
    out = tmp_path / "out"
    code = main(["eval", "commonroad", "--scenarios", str(bad_inputs), "--planners", "idm", "--out", str(out),
                 "--skip-bad", "--no-progress", "--gifs", "0"])
    text = capsys.readouterr().out
    assert code == 0, text
    results = json.loads((out / "results.json").read_text())
    assert len(results["bad"]) == 3
    (drive,) = results["drives"]
    assert drive["planner"] == "idm" and drive["scenario"] == "ZAM_Good-1"
    assert drive["judge"]["starts_ok"] and drive["judge"]["collision_free"], drive["judge"]["reasons"]
    assert Path(drive["solution"]).is_file()
    assert "Skipped 3 bad input(s)" in (out / "table.md").read_text()


def test_a_recorded_ego_kept_at_the_initial_state_is_named():
    from rad2_core.config import load_all, merged

    files = load_all()
    params = merged(files, *files)
    scenario, pset = _scenario("KeptEgo", obstacle_at=10.2)
    why = cb.why_bad(scenario, pset.planning_problem_dict[100], params)
    assert why is not None and "recorded ego is kept as obstacle" in why
    scenario, pset = _scenario("StartsInside", obstacle_at=13.0)
    why = cb.why_bad(scenario, pset.planning_problem_dict[100], params)
    assert why is not None and "already collides with obstacle" in why


def test_a_point_mass_leader_and_a_lanelet_goal_are_read_and_driven(tmp_path):
    """Recorded scenes from other sources carry other state kinds and goals: a leader logged as
    point-mass states (world-frame velocity components, no orientation) is read at its real speed and
    heading, the goal given as a lane polygon without a speed gives rad2 a pace, and the shipped planner
    drives the problem to a verdict without touching the slower leader."""
    import json

    from commonroad.geometry.shape import Polygon
    from commonroad.prediction.prediction import TrajectoryPrediction
    from commonroad.scenario.obstacle import DynamicObstacle
    from commonroad.scenario.state import PMState
    from commonroad.scenario.trajectory import Trajectory
    from rad2_bringup.cli import main
    from rad2_core.config import load_all, merged

    scenario, pset = _scenario("PointMass")
    lead_speed = 6.0
    states = [PMState(time_step=k, position=np.array([40.0 + lead_speed * DT * k, 0.0]), velocity=lead_speed,
                      velocity_y=0.0) for k in range(1, 121)]
    scenario.add_objects(DynamicObstacle(
        scenario.generate_object_id(), ObstacleType.CAR, Rectangle(4.5, 1.8),
        InitialState(position=np.array([40.0, 0.0]), orientation=0.0, velocity=lead_speed, time_step=0),
        TrajectoryPrediction(Trajectory(1, states), Rectangle(4.5, 1.8))))
    lane = Polygon(np.array([[60.0, -1.75], [95.0, -1.75], [95.0, 1.75], [60.0, 1.75]]))
    problem = pset.planning_problem_dict[100]
    problem.goal = GoalRegion([CustomState(position=lane, time_step=Interval(60, 100))])
    folder = tmp_path / "scenarios"
    folder.mkdir()
    _write(folder / "ZAM_PointMass-1_1_T-1.xml", scenario, pset)

    files = load_all()
    params = merged(files, *files)
    (item,) = cb.load_problems(sorted(folder.glob("*.xml")), params, progress=False)
    assert item.bad is None, item.bad
    lead = list(item.clip.agent_ids).index(scenario.dynamic_obstacles[0].obstacle_id)
    moving = item.clip.agent_valid[lead]
    assert np.allclose(item.clip.agent_vx[lead][moving], lead_speed)
    assert np.allclose(item.clip.agent_vy[lead][moving], 0.0)
    assert np.allclose(item.clip.agent_yaw[lead][moving], 0.0)
    pace = cb.goal_pace(item, params, DT)
    assert pace is not None  # the lane polygon's centre and the window's middle

    out = tmp_path / "out"
    code = main(["eval", "commonroad", "--scenarios", str(folder), "--planners", "rad2", "--out", str(out),
                 "--no-progress", "--gifs", "0"])
    assert code == 0
    (drive,) = json.loads((out / "results.json").read_text())["drives"]
    assert drive["judge"]["collision_free"] and not drive["rad2_collided"], drive
    assert drive["judge"]["on_road"] and drive["judge"]["feasible"]


def test_a_clip_becomes_a_planning_problem_the_logged_driver_solves(tmp_path):
    """rad2 data to-commonroad: a clip's map, agents and ego become a scenario with one planning problem
    that rad2's reader takes back (lanes, obstacles with their speeds), whose goal the logged driver's
    own track reaches without a collision and on the road, and that IDM drives to a verdict."""
    import sys

    from rad2_bringup.cli import main
    from rad2_core.config import load_all, merged
    from rad2_core.storage import save_dataset

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from synthetic_scenes import make_clip

    clip = make_clip(num_steps=101)
    data = tmp_path / "clips"
    save_dataset([clip], data)
    out = tmp_path / "cr"
    assert main(["data", "to-commonroad", "--data", str(data), "--out", str(out)]) == 0
    (path,) = sorted((out / "clips").glob("*.xml"))
    files = load_all()
    params = merged(files, *files)
    (item,) = cb.load_problems([path], params, progress=False)
    assert item.bad is None, item.bad
    assert len(item.scenario.lanelet_network.lanelets) == clip.map.num_lanes
    moving = item.clip.agent_valid & (np.hypot(item.clip.agent_vx, item.clip.agent_vy) > 1.0)
    assert moving.any()
    # the logged driver's track as a solution: in the goal area in time, no collision, on the road
    track = np.stack([clip.ego_x, clip.ego_y, clip.ego_yaw, clip.ego_speed, np.zeros(clip.num_steps)], -1)
    states = cb.ks_states(track[:81], 0, params)
    verdict = cb.judge(item.scenario, item.problem, cb.make_solution(item.scenario, item.problem_id, states))
    assert verdict["goal_reached"] and verdict["collision_free"] and verdict["on_road"], verdict["reasons"]
    assert main(["eval", "commonroad", "--scenarios", str(out), "--planners", "idm", "--out",
                 str(tmp_path / "run"), "--no-progress", "--gifs", "0"]) == 0


def test_to_commonroad_names_bad_input(tmp_path, capsys):
    """A folder that is no clip dataset stops the command with exit 2 and the folder named."""
    from rad2_bringup.cli import main

    not_data = tmp_path / "empty"
    not_data.mkdir()
    with pytest.raises(SystemExit) as stop:
        main(["data", "to-commonroad", "--data", str(not_data), "--out", str(tmp_path / "out")])
    assert stop.value.code == 2
    assert f"--data {not_data}: not a clip dataset" in capsys.readouterr().err
