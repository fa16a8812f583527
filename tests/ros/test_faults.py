"""Fault injection on the real nodes (separate processes, real Fast DDS on loopback).

- planner: NaN / oversized / wrong-grid / stale inputs -> the cycle is rejected, a fallback stop is
  republished (CandidateSet.selected_index -1, fallback_active in the diagnostics), the reason is
  reported, and the node keeps planning; dropped BEV messages and a CPU hog -> deadline misses are
  counted and visible in planning/diagnostics; the node exits cleanly (0) on SIGINT afterwards.
- perception-features node: malformed object lists / odometry are rejected, it keeps publishing.
- planner killed mid-clip in the closed loop (sim + planner + controller) -> the controller commands
  the minimal-risk stop at most 300 ms after the last trajectory (planner heartbeat lost) and reports
  it (tests/ros/test_hil.py holds the loop).
"""

from __future__ import annotations

import json
import sys
import textwrap

import numpy as np
import pytest
from ros_process import PRECONDITION_UNMET, ROOT, RosProcess, require_ros_build, ros_env, unique_domain_id

sys.path.insert(0, str(ROOT / "tests"))

from rad2_planner import planner_guard  # noqa: E402

# ---------------------------------------------------------------------------------------------------
# core: the fallback trajectory (no ROS)
# ---------------------------------------------------------------------------------------------------


def test_stopping_trajectory_follows_previous_plan_and_stops():
    dt, t = 0.5, 8
    prev = np.stack([np.arange(1, t + 1) * dt * 10.0, np.zeros(t)], axis=1)  # 10 m/s straight
    prev[:, 1] = 0.02 * prev[:, 0] ** 1.5  # a gentle left curve
    stop = planner_guard.stopping_trajectory(prev, dt, t, elapsed_s=0.5, speed=10.0, decel=2.5)
    s = np.concatenate([[0.0], np.cumsum(np.linalg.norm(np.diff(np.vstack([[0, 0], stop]), axis=0), axis=1))])
    v = np.diff(s) / dt
    assert np.allclose(stop[0], prev[0], atol=1e-6)  # before the takeover: the plan as it was
    assert np.all(np.diff(v[1:]) <= 1e-6) and v[-1] < v[1]  # then monotone braking
    assert np.all(np.diff(s) >= -1e-9)  # never backwards
    decel = -np.diff(v[1:]) / dt
    assert np.all(decel <= 2.5 * 1.001)  # chords of the curved path are slightly shorter than arcs
    # stays on the previous path: each point is close to the polyline of the plan
    dense = np.stack([np.interp(np.linspace(0, len(prev), 400), np.arange(len(prev) + 1),
                                np.concatenate([[0.0], prev[:, k]])) for k in range(2)], 1)
    gaps = [np.min(np.linalg.norm(dense - p, axis=1)) for p in stop]
    assert max(gaps) < 0.2
    # without a previous plan: straight line ahead, stops at v^2 / (2a)
    straight = planner_guard.stopping_trajectory(None, dt, t, 0.0, 5.0, 2.5)
    assert np.allclose(straight[:, 1], 0.0) and straight[-1, 0] == pytest.approx(5.0**2 / 5.0)
    with pytest.raises(ValueError):
        planner_guard.stopping_trajectory(None, dt, t, 0.0, 5.0, 0.0)


def test_check_age():
    lim = planner_guard.AgeLimits(max_age_s=0.3, max_stamp_skew_s=0.05)
    assert planner_guard.check_age(10.0, 10.1, lim) is None
    assert "stale" in planner_guard.check_age(10.0, 10.5, lim)
    assert "future" in planner_guard.check_age(10.2, 10.0, lim)
    assert "finite" in planner_guard.check_age(float("nan"), 10.0, lim)


# ---------------------------------------------------------------------------------------------------
# planner node: bad inputs, drops, CPU hog
# ---------------------------------------------------------------------------------------------------

PLANNER_DRIVER = textwrap.dedent(r"""
    import copy, json, os, subprocess, sys, time
    import numpy as np
    import rclpy
    sys.path.insert(0, sys.argv[2])
    from synthetic_scenes import make_clip
    from rad2_msgs.msg import BevFeatures, CandidateSet, PlanningDiagnostics, SceneTokens, Trajectory
    from rad2_ros import conversions as rc
    from rad2_core.bev import snapshot_from_clip
    from rad2_core.config import load_params
    from rad2_ros.nodes.common import command_qos, report_qos, setting_qos
    from std_msgs.msg import Float64
    from rad2_core.observation import build_observation

    planner_pid = int(sys.argv[1])
    params = {**load_params("bev"), **load_params("vehicle")}
    grid = rc.BevGrid.from_params(params["bev"])
    channels = list(params["bev"]["channels"])
    clip = make_clip(num_steps=80)
    obs = [build_observation(snapshot_from_clip(clip, t, params, params), params=params)
           for t in range(0, 80, 8)]

    rclpy.init()
    node = rclpy.create_node("planner_fault_driver")
    pub_bev = node.create_publisher(BevFeatures, "perception/bev_features", command_qos())
    pub_tok = node.create_publisher(SceneTokens, "perception/scene_tokens", command_qos())
    pub_mission = node.create_publisher(Float64, "planning/mission_speed", setting_qos())
    diags, cands, trajs = [], [], []
    node.create_subscription(PlanningDiagnostics, "planning/diagnostics",
                             lambda m: diags.append(rc.planning_diagnostics_from_msg(m)), report_qos(100))
    node.create_subscription(CandidateSet, "planning/candidates",
                             lambda m: cands.append((rc.time_to_ns(m.header.stamp), m.selected_index,
                                                     len(m.candidates))), report_qos(100))
    node.create_subscription(Trajectory, "planning/trajectory",
                             lambda m: trajs.append((rc.time_to_ns(m.header.stamp), len(m.points))),
                             command_qos())
    # wait for discovery of the planner's subscriptions
    end = time.monotonic() + 20
    def subscribed():
        return min(pub_bev.get_subscription_count(), pub_tok.get_subscription_count()) >= 1
    while time.monotonic() < end and not subscribed():
        rclpy.spin_once(node, timeout_sec=0.05)

    def spin(seconds):
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            rclpy.spin_once(node, timeout_sec=0.01)

    def messages(i, stamp):
        o = obs[i % len(obs)]
        bev = rc.bev_to_msg(o.bev, grid, channels, stamp)
        tok = rc.scene_tokens_to_msg(rc.SceneTokenArrays.from_observation(o, stamp))
        return bev, tok

    # before any input the planner is starved: wait for its report of that (it repeats every input
    # period while starved), so the first valid input never arrives before the driver could hear it
    end = time.monotonic() + 20
    while time.monotonic() < end and not any(d["input_stamp_ns"] == 0 and d["fallback_active"]
                                             for d in diags):
        rclpy.spin_once(node, timeout_sec=0.05)

    steps = []
    def step(i, kind, wait=True, send_bev=True):
        stamp = node.get_clock().now().nanoseconds
        bev, tok = messages(i, stamp)
        if kind == "nan_bev":
            data = np.frombuffer(bev.data, dtype=np.float32).copy(); data[1234] = np.nan
            bev.data = rc.float32_array(data)
        elif kind == "nan_tokens":
            tok.ego_speed = float("nan")
        elif kind == "oversized":
            tok.agents = list(tok.agents) + [copy.deepcopy(tok.agents[0]) for _ in range(40)]
        elif kind == "wrong_grid":
            small = rc.BevGrid(grid.resolution, grid.height // 2, grid.width, grid.origin_x, grid.origin_y)
            bev = rc.bev_to_msg(obs[0].bev[:, : grid.height // 2], small, channels, stamp)
        elif kind == "stale":
            stamp = stamp - 2_000_000_000
            bev.header.stamp = rc.ns_to_time(stamp); tok.header.stamp = rc.ns_to_time(stamp)
        n0 = len(diags)
        if send_bev:
            pub_bev.publish(bev)
        pub_tok.publish(tok)
        steps.append({"kind": kind, "stamp": stamp, "t": time.monotonic()})
        t0 = time.monotonic()
        if wait:  # lockstep: the next input only after this cycle's report (or 10 s)
            while time.monotonic() - t0 < 10 and not any(d["input_stamp_ns"] == stamp for d in diags[n0:]):
                rclpy.spin_once(node, timeout_sec=0.01)
        spin(max(0.0, 0.1 - (time.monotonic() - t0)))

    for i in range(6):
        step(i, "valid")
    # a mission speed, two impossible ones (refused: the planner drives without one), then none (NaN)
    for value, kind in ((15.0, "mission_15"), (-3.0, "mission_negative"), (float("inf"), "mission_inf"),
                        (float("nan"), "mission_none")):
        pub_mission.publish(Float64(data=value))
        spin(0.3)
        step(0, kind)
    for kind in ("nan_bev", "valid", "nan_tokens", "valid", "oversized", "valid", "wrong_grid", "valid",
                 "stale", "valid", "valid"):
        step(0, kind)
    for i in range(3):
        step(i, "drop", wait=False, send_bev=False)
    for i in range(5):
        step(i, "valid")

    # CPU hog: the planner's threads share CPU 0 with eight busy loops
    for tid in os.listdir(f"/proc/{planner_pid}/task"):
        try:
            os.sched_setaffinity(int(tid), {0})
        except OSError:
            pass
    hog_code = ("import os\nos.sched_setaffinity(0, {0})\ntry:\n os.nice(-10)\nexcept OSError:\n pass\n"
                "while True: pass")
    # one session each: with CFS autogroups, CPU time is shared per session, so N hogs in N sessions
    # leave the planner about 1/(N+1) of CPU 0 (nice alone only acts within a session)
    hogs = [subprocess.Popen([sys.executable, "-c", hog_code], start_new_session=True) for _ in range(8)]
    hog_start = time.monotonic()
    while time.monotonic() - hog_start < 3.0:
        step(0, "hog", wait=False)
    for h in hogs:
        h.kill(); h.wait()
    for tid in os.listdir(f"/proc/{planner_pid}/task"):
        try:
            os.sched_setaffinity(int(tid), set(range(os.cpu_count())))
        except OSError:
            pass
    hog_end = time.monotonic()
    spin(1.0)
    for i in range(8):
        step(i, "after_hog")
    spin(1.0)
    print("RESULT " + json.dumps({"steps": steps, "diags": diags, "cands": cands, "trajs": trajs,
                                  "hog": [hog_start, hog_end]}), flush=True)
    node.destroy_node()
    rclpy.shutdown()
""")


@pytest.fixture(scope="module")
def planner_fault_run(tmp_path_factory):
    require_ros_build()
    from rad2_bringup.bringup import Bringup

    tmp = tmp_path_factory.mktemp("planner_faults")
    domain = unique_domain_id()
    overrides = {"planner": {
        "planner.backend": "pytorch",  # no ONNX export at start-up: the test is about the node
        "planner.num_candidates": 8,
        "planner.num_denoise_steps": 2,
        "planner.deadline_ms": 200.0,
        "planner_node.random_init_if_missing": True,
    }}
    bring = Bringup("vehicle", domain_id=domain, log_dir=tmp, overrides=overrides, only=["planner"])
    script = tmp / "driver.py"
    script.write_text(PLANNER_DRIVER)
    with bring:
        bring.wait_ready(timeout=60)
        pid = bring.process("planner").popen.pid
        with RosProcess([str(script), str(pid), str(ROOT / "tests")], ros_env(domain), name="driver",
                        log_dir=tmp) as drv:
            rc_driver = drv.wait(timeout=75)
            out = drv.log()
        alive_after = bring.process("planner").alive()
        log = bring.process("planner").log_tail(400)
        codes = bring.stop()
    assert rc_driver == 0, out[-3000:]
    line = next(s for s in out.splitlines() if s.startswith("RESULT "))
    res = json.loads(line[len("RESULT "):])
    res.update(alive_after=alive_after, planner_log=log, exit_codes=codes)
    return res


def _diag_for(res, stamp):
    return [d for d in res["diags"] if d["input_stamp_ns"] == stamp]


@pytest.mark.parametrize("kind,why", [
    ("nan_bev", "non-finite"), ("nan_tokens", "ego_speed"), ("oversized", "more than the 32"),
    ("wrong_grid", "grid"), ("stale", "stale"),
])
def test_bad_input_is_rejected_with_fallback(planner_fault_run, kind, why):
    res = planner_fault_run
    step = next(s for s in res["steps"] if s["kind"] == kind)
    diags = _diag_for(res, step["stamp"])
    assert diags, f"no diagnostics for the {kind} cycle"
    d = diags[0]
    assert d["fallback_active"] and why in d["fallback_reason"], d["fallback_reason"]
    assert "rejected input" in d["fallback_reason"]
    # a fallback was republished: a candidate set with selected_index -1 at about that time
    fallbacks = [c for c in res["cands"] if c[1] == -1]
    assert fallbacks, "no fallback candidate set"
    # the next valid cycle plans normally again
    i = res["steps"].index(step)
    nxt = res["steps"][i + 1]
    assert nxt["kind"] == "valid"
    d2 = _diag_for(res, nxt["stamp"])
    assert d2 and not d2[0]["fallback_active"], d2


def test_a_mission_speed_is_taken_and_impossible_ones_are_refused(planner_fault_run):
    """planning/mission_speed: a speed is taken, a negative or infinite one is refused naming the field
    and the value (the planner then drives without one), NaN clears it; every cycle meanwhile plans."""
    res = planner_fault_run
    log = res["planner_log"]
    assert "mission speed: 15.00 m/s" in log
    assert "planning/mission_speed.data: value -3.0 is not a speed >= 0" in log
    assert "planning/mission_speed.data: value inf is not a speed >= 0" in log
    assert "mission speed: none" in log
    for kind in ("mission_15", "mission_negative", "mission_inf", "mission_none"):
        step = next(s for s in res["steps"] if s["kind"] == kind)
        d = _diag_for(res, step["stamp"])
        assert d and not d[0]["fallback_active"], (kind, d)


def test_rejections_counted_node_survives_and_exits_cleanly(planner_fault_run):
    res = planner_fault_run
    kinds = ("nan_bev", "nan_tokens", "oversized", "wrong_grid", "stale")
    bad = sum(s["kind"] in kinds for s in res["steps"])
    assert res["diags"][-1]["rejected_input_count"] >= bad
    assert res["alive_after"], res["planner_log"][-3000:]
    assert res["exit_codes"]["planner"] == 0, res["exit_codes"]
    assert "publishing a fallback stop" in res["planner_log"]
    # fallback trajectories are full-length stops (the controller can track them)
    assert all(n == 8 for _, n in res["trajs"])


def test_no_fallback_plan_before_any_valid_input(planner_fault_run):
    """Starved before its first valid input, the planner cannot time a stop (the ego's speed is
    unknown): it reports so and publishes no trajectory (a straight stop from an assumed 0 m/s is one
    the controller rejects at speed, trajectory.accel[0] = -59.76 at 15 m/s); the controller stops on
    its own for want of one."""
    res = planner_fault_run
    first_valid = res["steps"][0]["stamp"]
    early = [d for d in res["diags"] if d["fallback_active"] and d["input_stamp_ns"] == 0
             and "speed is unknown" in d["fallback_reason"]]
    assert early, [d["fallback_reason"] for d in res["diags"][:3]]
    assert all(stamp >= first_valid for stamp, _ in res["trajs"]), (first_valid, res["trajs"][:3])


def test_dropped_messages_count_as_deadline_misses(planner_fault_run):
    res = planner_fault_run
    steps = res["steps"]
    first_drop = next(i for i, s in enumerate(steps) if s["kind"] == "drop")
    before = _diag_for(res, steps[first_drop - 1]["stamp"])[0]
    after_step = steps[first_drop + 3]
    after = _diag_for(res, after_step["stamp"])[0]
    jump = after["deadline_miss_count"] - before["deadline_miss_count"]
    # typical increment between consecutive normal lockstep cycles (non-zero on a loaded host)
    valid = [s for s in steps[:first_drop] if s["kind"] == "valid"][2:]
    counts = [d[0]["deadline_miss_count"] for d in (_diag_for(res, s["stamp"]) for s in valid) if d]
    typical = float(np.median(np.diff(counts))) if len(counts) > 2 else 0.0
    assert jump >= 3 and jump >= typical + 2, (jump, typical)
    assert "missed" in res["planner_log"]


def test_cpu_hog_deadline_misses_visible(planner_fault_run):
    res = planner_fault_run
    hog_stamps = {s["stamp"] for s in res["steps"] if s["kind"] == "hog"}
    hog_diags = [d for d in res["diags"] if d["input_stamp_ns"] in hog_stamps]
    assert hog_diags, "the planner produced no cycle during the hog"
    assert any(d["deadline_missed"] and d["end_to_end_ms"] > 200.0 for d in hog_diags), \
        [round(d["end_to_end_ms"]) for d in hog_diags]
    first_hog = min(hog_stamps)
    # (diagnostics of starved periods carry no input stamp: 0)
    before = [d for d in res["diags"] if 0 < d["input_stamp_ns"] < first_hog][-1]["deadline_miss_count"]
    assert hog_diags[-1]["deadline_miss_count"] >= before + 2
    after = [d for d in res["diags"] if d["input_stamp_ns"] in
             {s["stamp"] for s in res["steps"] if s["kind"] == "after_hog"}]
    # planning resumes (a cycle may still be stale right after the hog on a loaded host)
    assert len(after) >= 6 and sum(not d["fallback_active"] for d in after) >= 4, \
        [d["fallback_reason"] for d in after]


# ---------------------------------------------------------------------------------------------------
# perception-features node: malformed inputs
# ---------------------------------------------------------------------------------------------------

PERCEPTION_DRIVER = textwrap.dedent(r"""
    import json, sys, time
    import numpy as np
    import rclpy
    sys.path.insert(0, sys.argv[1])
    from synthetic_scenes import make_clip
    from nav_msgs.msg import Odometry
    from rad2_msgs.msg import BevFeatures, PerceptionInputs, SceneTokens
    from rad2_ros import conversions as rc
    from rad2_ros.nodes.common import command_qos, sensor_qos

    clip = make_clip(num_steps=60)
    rclpy.init()
    node = rclpy.create_node("perception_fault_driver")
    po = node.create_publisher(PerceptionInputs, "perception/objects", command_qos())
    pd = node.create_publisher(Odometry, "localization/odometry", command_qos())
    got = {"bev": [], "tok": []}
    node.create_subscription(BevFeatures, "perception/bev_features",
                             lambda m: got["bev"].append(rc.time_to_ns(m.header.stamp)), sensor_qos())
    node.create_subscription(SceneTokens, "perception/scene_tokens",
                             lambda m: got["tok"].append((rc.time_to_ns(m.header.stamp), len(m.agents))),
                             sensor_qos())
    end = time.monotonic() + 20
    while time.monotonic() < end and (po.get_subscription_count() < 1 or pd.get_subscription_count() < 1):
        rclpy.spin_once(node, timeout_sec=0.05)
    time.sleep(0.5)
    sent = []
    for t in range(40):
        stamp = node.get_clock().now().nanoseconds
        kind = {12: "nan_odom", 20: "nan_object", 28: "duplicate_ids"}.get(t, "valid")
        a = clip.agents_at(t)
        agents = rc.AgentList(a.ids, a.types, a.x, a.y, a.yaw, a.length, a.width, a.vx, a.vy)
        odom = rc.odometry_to_msg(rc.EgoMotion(clip.ego_x[t], clip.ego_y[t], clip.ego_yaw[t],
                                               clip.ego_speed[t], 0.0, stamp))
        objs = rc.perception_inputs_to_msg(agents, stamp)
        if kind == "nan_odom":
            odom.pose.pose.position.x = float("nan")
        elif kind == "nan_object":
            objs.agents[0].pose.x = float("nan")
        elif kind == "duplicate_ids":
            objs.agents[1].id = objs.agents[0].id
        if kind != "nan_odom":
            pd.publish(odom)
        else:
            pd.publish(odom)
        po.publish(objs)
        sent.append((kind, stamp, len(agents)))
        end = time.monotonic() + 0.1
        while time.monotonic() < end:
            rclpy.spin_once(node, timeout_sec=0.01)
    end = time.monotonic() + 1.0
    while time.monotonic() < end:
        rclpy.spin_once(node, timeout_sec=0.01)
    print("RESULT " + json.dumps({"sent": sent, "got": got}), flush=True)
""")


def test_perception_node_rejects_malformed_inputs_and_keeps_running(tmp_path):
    require_ros_build()
    from rad2_bringup.bringup import Bringup
    from rad2_core.storage import save_dataset
    from synthetic_scenes import make_clip

    save_dataset([make_clip(num_steps=60)], tmp_path / "ds")
    domain = unique_domain_id()
    bring = Bringup("vehicle", args={"map_file": str(tmp_path / "ds")}, domain_id=domain, log_dir=tmp_path,
                    only=["bev_features"])
    script = tmp_path / "driver.py"
    script.write_text(PERCEPTION_DRIVER)
    with bring:
        bring.wait_ready(timeout=60)
        with RosProcess([str(script), str(ROOT / "tests")], ros_env(domain), name="driver",
                        log_dir=tmp_path) as d:
            assert d.wait(timeout=60) == 0, d.log()[-3000:]
            out = d.log()
        alive = bring.process("bev_features").alive()
        log = bring.process("bev_features").log_tail(200)
        codes = bring.stop()
    res = json.loads(next(s for s in out.splitlines() if s.startswith("RESULT "))[len("RESULT "):])
    assert alive and codes["bev_features"] == 0, log
    stamps = {k: s for k, s, _ in res["sent"]}
    got_bev = set(res["got"]["bev"])
    for kind in ("nan_object", "duplicate_ids"):
        assert stamps[kind] not in got_bev, f"{kind} produced features"
    assert "rejected objects" in log and "rejected odometry" in log, log
    valid_after = [s for k, s, _ in res["sent"][30:] if k == "valid"]
    assert len(got_bev & set(valid_after)) >= 0.7 * len(valid_after), "node stopped publishing"
    # tokens carry the agents of the object list (the synthetic clip has agents around the ego)
    assert any(n > 0 for _, n in res["got"]["tok"])


# ---------------------------------------------------------------------------------------------------
# planner killed mid-clip in the closed loop
# ---------------------------------------------------------------------------------------------------

KILL_CLIP = ("data/eval_efficiency", "sumo_free_road_20350103")


def test_planner_killed_mid_clip_controller_stops(tmp_path):
    require_ros_build()
    from rad2_core.config import load_params
    from rad2_core.storage import load_clip, read_index, save_dataset
    from test_hil import _driver_args, _result

    split = ROOT / KILL_CLIP[0]
    entry = next(e for e in read_index(split)["clips"] if e["clip_id"] == KILL_CLIP[1])
    save_dataset([load_clip(split / entry["file"], maps_dir=split / "maps")], tmp_path / "ds")
    ctrl = load_params("controller")["controller"]["node"]
    stale, decel = float(ctrl["stale_timeout_s"]), float(ctrl["stop_decel"])
    hb_timeout = float(ctrl["planner_heartbeat_timeout_s"])
    # a light planner (M=8, K=2): this test is about the controller's reaction, not plan quality
    light = {"planner.num_candidates": 8, "planner.num_denoise_steps": 2}
    # once more on a fresh domain when no plan ever reached the controller (the driver exits with
    # PRECONDITION_UNMET: separate processes that never discovered each other, seen once in CI under
    # load); any other failure fails at once
    for attempt in range(2):
        domain = unique_domain_id()
        args = _driver_args("kill", tmp_path / "ds", domain, tmp_path / f"logs{attempt}",
                            planner_overrides=light, kill_after=5, observe=3.0, timeout=60)
        with RosProcess(args, ros_env(domain), name=f"kill_driver{attempt}", log_dir=tmp_path) as drv:
            code = drv.wait(timeout=150)
            log = drv.log()
        if code != PRECONDITION_UNMET:
            break
    assert code == 0, log[-4000:]
    res = _result(log)
    t_kill = res["t_kill_ns"]
    assert res["planner_returncode"] == -9
    assert res["controller_alive"] and res["sim_alive"], "a node died with the planner"
    before = [c for c in res["commands"] if c[0] < t_kill]
    assert before and not before[-1][1], "the controller was not tracking a plan before the kill"
    stops = [c for c in res["commands"] if c[0] > t_kill and c[1]]
    assert stops, "no minimal-risk stop after the planner was killed"
    stop_s = (stops[0][0] - t_kill) / 1e9
    since_last = (stops[0][0] - res["t_last_traj_ns"]) / 1e9
    # the planner's heartbeat (controller.node.planner_heartbeat_timeout_s), not only the trajectory
    # timeout, triggers the stop: at most 300 ms after the last trajectory (simulated time runs at
    # wall speed; the monitor's receive times add DDS delivery)
    print(f"planner kill -> minimal-risk stop command: {stop_s * 1e3:.0f} ms after the kill, "
          f"{since_last * 1e3:.0f} ms after the last trajectory (heartbeat timeout {hb_timeout} s): "
          f"{stops[0][2]}")
    assert since_last <= 0.300, since_last
    assert stop_s <= stale, stop_s
    assert "planner heartbeat lost" in stops[0][2], stops[0][2]
    # every command after the first stop is a stop, until the end of the observation
    after = [c for c in res["commands"] if c[0] >= stops[0][0]]
    assert all(c[1] for c in after), [c[2] for c in after if not c[1]][:3]
    # reported: the controller's diagnostics carry the fallback and its reason
    reported = [d for d in res["control_diags"] if d["receive_ns"] and d["receive_ns"] > t_kill
                and d["fallback_active"]]
    assert reported and "heartbeat lost" in reported[0]["fallback_reason"], reported[:1]
    # and the ego actually slows down (odometry from the sim), at no more than the stop deceleration.
    # The simulator can stand still after the kill (it writes into the dead planner's shared-memory
    # port; the clip may also end): then there is no motion to judge, and the commands above, stops
    # with their reason through the whole observation, are what the controller answers for (the
    # paused-clock case has its own test below)
    assert res["exit_codes"]["controller"] == 0, res["exit_codes"]
    speeds = [(t, v) for t, _, v in res["odom"] if t >= stops[0][0]]
    if len(speeds) < 10:
        print(f"the simulator published {len(speeds)} odometry samples after the stop (clip results: "
              f"{[(r.get('clip_id'), r.get('termination')) for r in res['results']]}): no motion to judge")
        assert len(after) >= 10, len(after)  # the controller kept commanding the stop meanwhile
        return
    v0, v1 = speeds[0][1], speeds[-1][1]
    dt = (speeds[-1][0] - speeds[0][0]) / 1e9
    assert v1 < v0 - 0.5 * decel * dt * 0.5 or v1 < 0.5, (v0, v1, dt)
    assert res["exit_codes"]["bev_warp_sim"] == 0, res["exit_codes"]


def test_planner_killed_while_simulated_time_stands_still_controller_stops(tmp_path):
    """The simulator is stopped (SIGSTOP: /clock stands still, as while it loads the next clip) and the
    planner killed: the controller's cycle timer, on simulated time, does not run, and its steady-clock
    watchdog commands the minimal-risk stop, naming the lost heartbeat, at most 300 ms after the last
    trajectory."""
    require_ros_build()
    from rad2_core.storage import load_clip, read_index, save_dataset
    from test_hil import _driver_args, _result

    split = ROOT / KILL_CLIP[0]
    entry = next(e for e in read_index(split)["clips"] if e["clip_id"] == KILL_CLIP[1])
    save_dataset([load_clip(split / entry["file"], maps_dir=split / "maps")], tmp_path / "ds")
    light = {"planner.num_candidates": 8, "planner.num_denoise_steps": 2}
    for attempt in range(2):  # a fresh domain once when the graph never got going (see above)
        domain = unique_domain_id()
        args = _driver_args("pause_kill", tmp_path / "ds", domain, tmp_path / f"logs{attempt}",
                            planner_overrides=light, kill_after=5, observe=1.5, timeout=60)
        with RosProcess(args, ros_env(domain), name=f"pause_kill_driver{attempt}", log_dir=tmp_path) as drv:
            code = drv.wait(timeout=150)
            log = drv.log()
        if code != PRECONDITION_UNMET:
            break
    assert code == 0, log[-4000:]
    res = _result(log)
    t_kill = res["t_kill_ns"]
    stops = [c for c in res["commands"] if c[0] > t_kill and c[1]]
    assert stops, "no minimal-risk stop while simulated time stood still"
    since_last = (stops[0][0] - res["t_last_traj_ns"]) / 1e9
    print(f"planner kill with /clock stopped -> stop command {(stops[0][0] - t_kill) / 1e6:.0f} ms after "
          f"the kill, {since_last * 1e3:.0f} ms after the last trajectory: {stops[0][2]}")
    assert "watchdog" in stops[0][2] and "planner heartbeat lost" in stops[0][2], stops[0][2]
    assert since_last <= 0.300, since_last
    assert res["controller_alive"] and res["exit_codes"]["controller"] == 0, res["exit_codes"]


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", "-x"]))
