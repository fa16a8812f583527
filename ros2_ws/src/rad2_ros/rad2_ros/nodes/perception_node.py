"""BEV perception-features node (``bev_features``): object list + map + odometry -> BEV + scene tokens.

Subscribes
    perception/objects       rad2_msgs/PerceptionInputs  tracked objects, world frame ("map")
    localization/odometry    nav_msgs/Odometry           ego box-centre pose (world) and speed/yaw rate
Publishes (reliable keep-last-1 publishers; the planner subscribes best effort)
    perception/bev_features  rad2_msgs/BevFeatures       [C, H, W] raster, ego frame at the objects stamp
    perception/scene_tokens  rad2_msgs/SceneTokens       map polylines, agents, route, ego state

The lane map and the route are loaded once at start-up from ``perception.map_file`` (a clip .npz or
a dataset directory, clip ``perception.clip_id``; or a Lanelet2 .osm map with the mission
``perception.route``, odometry in the map's frame: its nodes' local_x/local_y metres when every node
has them, else a local projection at its first node), like Autoware's map loader with a fixed mission
route. Each object list is one cycle: the node keeps ``perception.history_s`` of object lists and
odometry (for the ``agents_t-k`` occupancy channels and the ego acceleration), interpolates the ego
pose at the objects stamp, and calls the core (``rad2_datasets.live_scene`` -> ``bev.rasterize_bev``,
``tokens``, ``observation.build_observation``); both outputs carry the objects stamp, so the planner
pairs them and measures its end-to-end latency from it.

Replacing this node with a camera BEV backbone
-----------------------------------------------
A learned BEV encoder (e.g. a BEVFormer/LSS-style network over surround cameras) replaces this node
by publishing the SAME two topics with the SAME messages, nothing else changes downstream:
- ``perception/bev_features``: rad2_msgs/BevFeatures with the grid of params/bev.yaml (resolution,
  height, width, origin_x, origin_y), ``channel_names`` equal to ``bev.channels`` in that order
  (the planner rejects any other grid or channel list), float32 values in the channel units
  documented in docs/conventions.md (0..1 occupancy/masks, m/s velocities in the ego frame, m/s
  speed limits), ``header.frame_id`` "base_link" and ``header.stamp`` the sensor time of the frame.
  A backbone producing learned latent channels instead must ship a planner checkpoint trained on
  them and list its channel names in bev.yaml.
- ``perception/scene_tokens``: rad2_msgs/SceneTokens with the same stamp: at most
  ``tokens.map.num_polylines`` polylines of exactly ``tokens.map.points_per_polyline`` points,
  at most ``tokens.agents.num_agents`` agents, at most ``tokens.route.num_points`` route poses, the
  ego state (speed, longitudinal acceleration, yaw rate, steering), ego frame.
- QoS: best-effort-compatible (any reliability), keep-last-1; publish both for every frame.
Everything is validated by the planner (``rad2_ros.conversions`` decoders): a backbone
that violates the contract gets its cycles rejected and the planner's fallback, not a crash.

Plausibility: odometry passes ``supervision.OdometryGate`` (``validators.check_odometry`` alone and
against the last accepted sample; a pose jump is accepted as a relocalisation only once
``validators.odometry.reset_confirm_samples`` consecutive samples agree), object lists pass
``validators.check_objects`` around the ego. A rejected message is counted, logged and reported on
``/diagnostics`` (status "bev_features", the field and value named) and never reaches the outputs:
a rejected object list produces no features for its stamp (the planner then falls back). A thread
publishes ``/heartbeat/bev_features`` every ``heartbeat.period_s``.

Time and rate: odometry and object-list stamps go through the clock model (``supervision.StampClock``,
``validators.clock``: stale, from the future or out of order against this node's clock are named
faults, never a relocalisation); an object list whose ``header.frame_id`` is not
``perception.world_frame`` is rejected naming it. Each stream is read at most once per period of its
stamps (``validators.odometry.max_rate_hz``, ``validators.objects.max_rate_hz``): a flood is dropped
unread, counted (``*_flood_dropped``) and reported, so it cannot take the CPU the planner needs.
Odometry is polled (``common.PolledCallbackGroup``): read with each object list, the newest
``POLLED_DEPTH`` samples, never an executor wake-up per sample.
"""

from __future__ import annotations

import time

from nav_msgs.msg import Odometry
from rad2_core import validators
from rad2_core.bev import AgentFrame, BevError
from rad2_core.observation import ObservationError
from rad2_core.supervision import ClockLimits, OdometryGate, RateGate, StampClock, describe_violations
from rad2_datasets.live_scene import LiveScene, LiveSceneError, load_map_and_route
from rad2_msgs.msg import BevFeatures, PerceptionInputs, SceneTokens
from rad2_planner.policy import resolve_path
from rclpy.node import Node
from rclpy.serialization import deserialize_message

from rad2_ros import conversions as rc
from rad2_ros.nodes.common import (
    POLLED_DEPTH,
    DiagnosticsReporter,
    Heartbeat,
    PolledCallbackGroup,
    Throttle,
    cdr_header_stamp_ns,
    command_qos,
    run_node,
    sensor_qos,
    stop_heartbeat,
    take_waiting,
)
from rad2_ros.nodes.parameters import declare_parameters

PARAM_FILES = ["bev", "vehicle", "nodes", "validators"]
PREFIXES = ("bev", "tokens", "vehicle", "perception", "heartbeat", "validators")


class PerceptionNode(Node):
    def __init__(self, **kwargs):
        super().__init__("bev_features", **kwargs)
        self.params = declare_parameters(self, PARAM_FILES, prefixes=PREFIXES,
                                         cli_args=kwargs.get("cli_args"))
        c = self.params["perception"]
        self.frame_id = str(c["frame_id"])
        self.grid = rc.BevGrid.from_params(self.params["bev"])
        self.channels = list(self.params["bev"]["channels"])
        scene = load_map_and_route(resolve_path(c["map_file"]), str(c["clip_id"]), str(c["route"]),
                                   params=self.params)
        self.scene = LiveScene(scene, self.params, step_s=float(c["step_s"]), history_s=float(c["history_s"]),
                               odom_max_age_s=float(c["odom_max_age_s"]),
                               history_tolerance_s=float(c["history_tolerance_s"]))
        self.throttle = Throttle(2.0)
        self.limits = self.params["validators"]
        self.world_frame = str(c["world_frame"])
        use_sim_time = bool(self.get_parameter("use_sim_time").value)
        clock = ClockLimits.from_params(self.limits["clock"], use_sim_time)
        self.gate = OdometryGate(self.limits, int(self.limits["odometry"]["reset_confirm_samples"]),
                                 StampClock("odometry.header.stamp", clock))
        self.objects_clock = StampClock("objects.header.stamp", clock)
        self.odom_rate = RateGate(float(self.limits["odometry"]["max_rate_hz"]))
        self.objects_rate = RateGate(float(self.limits["objects"]["max_rate_hz"]))
        self.rejected = 0
        self.cycles = 0
        self.last_fault = ""
        self.diagnostics = DiagnosticsReporter(self)
        self.pub_bev = self.create_publisher(BevFeatures, "perception/bev_features", command_qos())
        self.pub_tokens = self.create_publisher(SceneTokens, "perception/scene_tokens", command_qos())
        # polled with each object list (the one use of the pose): no executor wake-up per sample, so an
        # odometry flood costs this process nothing but the newest POLLED_DEPTH samples per list
        self.sub_odom = self.create_subscription(Odometry, "localization/odometry", self._on_odom,
                                                 sensor_qos(POLLED_DEPTH), raw=True,
                                                 callback_group=PolledCallbackGroup())
        # object lists: reliable keep-last-1 request would also match; best effort keeps up with 10 Hz
        self.create_subscription(PerceptionInputs, "perception/objects", self._on_objects, sensor_qos())
        self.get_logger().info(f"perception features ready: map {scene.source} "
                               f"({len(scene.lane_map.lane_ids)} lanes), grid {len(self.channels)}x"
                               f"{self.grid.height}x{self.grid.width}")
        self.heartbeat = Heartbeat(self, float(self.params["heartbeat"]["period_s"]))

    def destroy_node(self):
        stop_heartbeat(self)
        return super().destroy_node()

    def _status(self, level: str, message: str) -> None:
        now = time.monotonic_ns()
        floods = [f"{name} flood: {gate.rate_hz(now):.0f} messages/s > {gate.max_rate_hz:g} Hz, one per "
                  f"{gate.min_period_ns / 1e6:g} ms of stamps read"
                  for name, gate in (("odometry", self.odom_rate), ("objects", self.objects_rate))
                  if gate.flooding(now)]
        if floods and level == "ok":
            level, message = "warn", "; ".join(floods)
        self.diagnostics.publish(level, message, {
            "cycles": self.cycles, "rejected_input_count": self.rejected,
            "odometry_resets": self.gate.reset_count, "last_fault": self.last_fault[:300],
            "odometry_clock_faults": sum(self.gate.clock.faults.values()),
            "objects_clock_faults": sum(self.objects_clock.faults.values()),
            "odometry_flood_dropped": self.odom_rate.dropped,
            "objects_flood_dropped": self.objects_rate.dropped})

    def _reject(self, what: str, exc: Exception | str) -> None:
        self.rejected += 1
        self.last_fault = f"rejected {what}: {exc}"
        self._status("error", self.last_fault)
        if self.throttle(what):
            self.get_logger().error(f"rejected {what} ({self.rejected} so far): {exc}")

    def _on_odom(self, data: bytes) -> None:
        # serialized: a flood is dropped on its stamp alone, only an admitted sample is deserialized
        if not self.odom_rate.admit(cdr_header_stamp_ns(data), time.monotonic_ns()):
            return
        try:
            m = rc.odometry_from_msg(deserialize_message(data, Odometry))
            gate = self.gate.offer(m, self.get_clock().now().nanoseconds)
            if not gate.accepted:
                what = "clock fault" if gate.violations[0].field.endswith("header.stamp") else "implausible"
                self._reject("odometry", f"{what} {gate.reason}")
                return
            if gate.reset:
                self.get_logger().warning(f"odometry relocalised at {m.x:.1f}, {m.y:.1f} (confirmed by "
                                          f"{self.gate.confirm_samples} samples)")
            self.scene.add_odometry(m.stamp_ns / 1e9, m.x, m.y, m.yaw, m.speed, m.yaw_rate)
        except (rc.MessageValidationError, LiveSceneError) as exc:
            self._reject("odometry", exc)

    def _on_objects(self, msg: PerceptionInputs) -> None:
        t0 = time.perf_counter()
        if not self.objects_rate.admit(rc.time_to_ns(msg.header.stamp), time.monotonic_ns()):
            return  # a flood: dropped unread
        take_waiting(self.sub_odom, self._on_odom, POLLED_DEPTH)  # the poses up to this list
        try:
            frame_id = str(msg.header.frame_id)
            if frame_id != self.world_frame:
                self._reject("objects", f"objects.header.frame_id = {frame_id!r}: object lists must be in "
                             f"{self.world_frame!r} (perception.world_frame)")
                return
            agents, stamp_ns, _frame = rc.perception_inputs_from_msg(msg)
            signals = rc.perception_signals_from_msg(msg)
            a = agents
            ego = self.gate.last  # without accepted odometry the scene rejects the objects itself
            bad = [] if ego is None else validators.check_objects(a.length, a.width, a.vx, a.vy, a.x, a.y,
                                                                  self.limits, ego_xy=(ego.x, ego.y))
            if stamp_ns <= 0:
                bad.append(validators.Violation("header.stamp", float(stamp_ns), "> 0 (an unset stamp)"))
            if bad:
                self._reject("objects", f"implausible {describe_violations(bad)}")
                return
            verdict = self.objects_clock.check(stamp_ns, self.get_clock().now().nanoseconds)
            if not verdict.accepted:
                self._reject("objects", f"clock fault {verdict.reason}")
                return
            self.objects_clock.accept(stamp_ns)
            frame = AgentFrame.from_arrays(a.ids, a.types, a.x, a.y, a.yaw, a.vx, a.vy, a.length, a.width)
            self.scene.add_objects(stamp_ns / 1e9, frame)
            foreign = self.scene.add_signals(stamp_ns / 1e9, signals)
            if foreign and self.throttle("signals"):
                self.get_logger().warning(f"objects: signals {foreign[:8]} are not in the map; ignored")
            obs = self.scene.observation(stamp_ns / 1e9)
        except (rc.MessageValidationError, LiveSceneError, BevError, ObservationError, ValueError) as exc:
            self._reject("objects", exc)
            return
        tokens = rc.SceneTokenArrays.from_observation(obs, stamp_ns, self.frame_id)
        self.pub_bev.publish(rc.bev_to_msg(obs.bev, self.grid, self.channels, stamp_ns, self.frame_id))
        self.pub_tokens.publish(rc.scene_tokens_to_msg(tokens))
        self.cycles += 1
        self._status("ok", "publishing features")
        if self.cycles == 1 or self.cycles % 100 == 0:
            ms = (time.perf_counter() - t0) * 1e3
            self.get_logger().info(f"cycle {self.cycles}: features in {ms:.1f} ms (rejected inputs "
                                   f"{self.rejected})")


def main(args=None) -> int:
    return run_node(PerceptionNode, args)


if __name__ == "__main__":
    raise SystemExit(main())
