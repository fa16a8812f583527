"""bev_warp_sim node as a real process, driven by a second process that plays the controller.

The driver follows the simulated /clock from the first tick it hears (t0; DDS may match its /clock
subscription a moment after the sim started holding the clip): valid commands (hold speed, straight)
until t0 + 2.0 s, malformed ones (NaN acceleration) until t0 + 2.2 s (shorter than
node.stale_command_s), valid again until t0 + 4.0 s (with an acceleration of -1e6 m/s^2 from 3.5 to 3.7
s, and a steering angle of 1e9 rad for the step at 3.5 s: clamped to the vehicle's limits), then
silence. The node must publish BEV features, scene tokens and odometry every step, survive the malformed
commands (holding the last valid one), say once per field that it clamped a command (log, /diagnostics,
the episode's command_clamps), brake once commands go stale, and report the episode and the final
summary as JSON.
"""

from __future__ import annotations

import json
import textwrap

import pytest
from ros_process import ROOT, RosProcess, require_ros_build, ros_env
from synthetic_scenes import make_clip

DRIVER = textwrap.dedent("""
    import json, math, time
    import rclpy
    from nav_msgs.msg import Odometry
    from rad2_msgs.msg import BevFeatures, ControlCommand, SceneTokens
    from rclpy.qos import QoSProfile, ReliabilityPolicy
    from rosgraph_msgs.msg import Clock
    from std_msgs.msg import String

    rclpy.init()
    node = rclpy.create_node("sim_node_test_driver")
    best = QoSProfile(depth=10, reliability=ReliabilityPolicy.BEST_EFFORT)
    rel = QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE)
    pub = node.create_publisher(ControlCommand, "control/command",
                                QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE))
    seen = {"clock": [], "odom": [], "bev": 0, "bev_shape": None, "tokens": 0, "results": [], "diag": []}
    now = {"t": 0.0, "t0": None}

    def on_clock(m):
        now["t"] = m.clock.sec + m.clock.nanosec * 1e-9
        if now["t0"] is None:
            now["t0"] = now["t"]
        seen["clock"].append(now["t"])

    def on_odom(m):
        seen["odom"].append((now["t"], m.twist.twist.linear.x, m.pose.pose.position.x))

    def on_bev(m):
        seen["bev"] += 1
        seen["bev_shape"] = [len(m.channel_names), m.height, m.width, len(m.data)]

    def on_tokens(m):
        seen["tokens"] += 1

    def on_result(m):
        seen["results"].append(json.loads(m.data))

    node.create_subscription(Clock, "/clock", on_clock, rel)
    node.create_subscription(Odometry, "localization/odometry", on_odom, best)
    node.create_subscription(BevFeatures, "perception/bev_features", on_bev, best)
    node.create_subscription(SceneTokens, "perception/scene_tokens", on_tokens, best)
    node.create_subscription(String, "sim/episode_result", on_result, rel)
    from diagnostic_msgs.msg import DiagnosticArray
    node.create_subscription(DiagnosticArray, "/diagnostics", lambda m: seen["diag"].extend(
        (st.name, int.from_bytes(st.level, "little") if isinstance(st.level, bytes) else int(st.level),
         st.message) for st in m.status), rel)
    t0 = time.monotonic()
    while time.monotonic() - t0 < 60 and not any(r.get("done") for r in seen["results"]):
        rclpy.spin_once(node, timeout_sec=0.01)
        if now["t0"] is None:
            continue  # no time yet: a command could not be placed in the schedule
        t = now["t"] - now["t0"]
        if t < 4.0:
            cmd = ControlCommand()
            cmd.acceleration = float("nan") if 2.0 <= t < 2.2 else (-1e6 if 3.5 <= t < 3.7 else 0.0)
            if 3.5 <= t < 3.6:
                # every command of one simulated step (the clock reads 3.5 s until the next): the
                # simulator steps with the newest command, so a single message would usually be
                # overtaken before a step applies it; one step of full lock keeps the ego on the road
                cmd.steering_angle = 1e9
            cmd.target_speed = 10.0
            pub.publish(cmd)
    seen["t0"] = now["t0"]
    print("RESULT " + json.dumps(seen), flush=True)
    node.destroy_node()
    rclpy.shutdown()
""")


def test_sim_node_closed_loop(tmp_path):
    require_ros_build()
    from rad2_core.storage import save_dataset

    data = tmp_path / "data"
    save_dataset([make_clip(num_steps=121)], data)
    env = ros_env()
    exe = ROOT / "ros2_ws" / "install" / "rad2_ros" / "lib" / "rad2_ros" / "sim_node"
    args = [str(exe), "--ros-args", "--params-file", str(ROOT / "params" / "sim.yaml"),
            "-p", f"node.dataset:={data}", "-p", "node.realtime_factor:=2.0", "-p", "sim.max_steps:=60",
            "-p", "node.exit_when_done:=true", "-p", "node.wait_for_first_command_s:=10.0"]
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    with RosProcess([str(script)], env, name="driver", log_dir=tmp_path) as drv:
        with RosProcess(args, env, name="sim", log_dir=tmp_path) as sim:
            sim.wait_for_output("bev_warp_sim ready", timeout=60)
            assert drv.wait(timeout=90) == 0, drv.log()[-3000:] + sim.log()[-3000:]
            out = drv.log()
            sim_log = sim.wait(timeout=30) == 0, sim.log()
    assert sim_log[0], sim_log[1][-3000:]
    res = json.loads(next(s for s in out.splitlines() if s.startswith("RESULT "))[len("RESULT "):])
    # observations every step
    assert res["bev_shape"][1:3] == [128, 128] and res["bev_shape"][3] == res["bev_shape"][0] * 128 * 128
    assert res["bev"] >= 40 and res["tokens"] >= 40
    clock, t0 = res["clock"], res["t0"]
    assert clock == sorted(clock) and max(clock) >= t0 + 5.5
    odom = res["odom"]
    steady = [(t, v) for t, v, _ in odom if 0.5 <= t - t0 < 3.5]
    assert steady and all(abs(v - 10.0) < 0.3 for _, v in steady), steady  # NaN commands ignored
    late = [v for t, v, _ in odom if t - t0 >= 5.0]
    assert late and max(late) < 8.0  # stale -> braking
    episodes = [r for r in res["results"] if "clip_id" in r]
    assert len(episodes) == 1 and episodes[0]["clip_id"] == "synthetic_0"
    assert episodes[0]["termination"] == "max_steps"
    summary = next(r for r in res["results"] if r.get("done"))
    assert summary["rejected_commands"] >= 1 and summary["num_clips"] == 1
    assert "Safety@1" in summary["metrics"]
    assert "rejected control command" in sim_log[1]
    # the clamps: said once per field in the log and on /diagnostics, counted in the episode result
    clamps = episodes[0]["command_clamps"]
    assert clamps.get("acceleration", 0) >= 3 and clamps.get("steering_angle", 0) >= 1, clamps
    assert summary["clamped_commands"] == sum(clamps.values())
    for field, value in (("acceleration", "-1e+06"), ("steering_angle", "1e+09")):
        line = f"control/command {field} = {value} beyond the vehicle's"
        assert sim_log[1].count(line) == 1, sim_log[1][-2000:]
        assert any(name == "bev_warp_sim" and level == 1 and line in text
                   for name, level, text in res["diag"]), res["diag"][:3]
    dips = [v for t, v, _ in odom if 3.5 <= t - t0 < 3.8]
    assert dips and min(dips) > 10.0 - 8.0 * 0.35, dips  # clamped: no harder than the vehicle brakes


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
