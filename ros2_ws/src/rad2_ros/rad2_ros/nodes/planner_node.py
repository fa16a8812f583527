"""Planner node (``planner``): RAD-2 generator + discriminator on the configured backend.

Subscribes (sensor-data QoS: best effort, keep-last-1)
    perception/bev_features   rad2_msgs/BevFeatures
    perception/scene_tokens   rad2_msgs/SceneTokens
and pairs them by header stamp, and (reliable, transient local: the value in force reaches a late start)
    planning/mission_speed    std_msgs/Float64   the speed the mission asks for (m/s; NaN: none), e.g.
                              the pace that reaches a goal in its time window: the mission-pace stage
                              re-times the selected plan towards it where the road ahead is clear
                              (``rad2_planner.mission_pace``); a negative, infinite or faster-than-the-
                              vehicle value is refused, named in the log and on /diagnostics, and the
                              planner drives without one until a valid value comes.
Each pair is one planning cycle (``Rad2Policy.plan``); it publishes
    planning/candidates   rad2_msgs/CandidateSet         all M candidates with scores (reliable)
    planning/trajectory   rad2_msgs/Trajectory           the selected one, ego frame at the input stamp
    planning/path         nav_msgs/Path                  the same for RViz / Foxglove
    planning/markers      visualization_msgs/MarkerArray candidates coloured by score (red -> green)
    planning/diagnostics  rad2_msgs/PlanningDiagnostics  every cycle: stage timings (preprocess,
                          encode, denoise_<k> or denoise_total, score, select, critic,
                          corrections, traffic_rules, safety_envelope, comfort_limits,
                          validate_output: the plan's kinematic and deviation check, publish),
                          end-to-end latency from the input stamp, deadline misses, rejected
                          inputs, fallback state

Safety layer (``safety_layer.*`` of planner.yaml, ``Rad2Policy`` stage 5): when ``safety_layer.mode`` is
not ``off`` the stages carry the critic's time (``critic``) and that of the extra rejection-sampling
rounds (``corrections``), and the cycle's status on ``/diagnostics`` the mode (``safety_layer``), the
cycle's ``corrections``, the executed candidate's ``critic_p`` and ``critic_accepted``,
``safety_stopped_by_budget`` (rounds cut by ``round_budget_ms``) and the counters
``safety_corrected_cycle_count`` / ``safety_budget_stop_count``.

Bad input (non-finite values, sizes other than the configured grid/token counts, implausible
values — ``rad2_core.validators.check_bev`` / ``check_tokens`` —, stale stamps or stamps further in
the future than the tolerance of the node's clock: ``max_stamp_skew_s`` on the system clock,
``max_stamp_skew_sim_s`` on /clock), a planner exception, non-finite output, or a selected plan that
fails ``planner_guard.check_plan_output`` (vehicle kinematics, deviation from the previous cycle's plan)
rejects the cycle: the node logs why (throttled), counts it, and republishes a safe fallback — the
previous plan's path re-timed to brake to a stop (``rad2_planner.planner_guard.stopping_trajectory``),
or a straight stop from the last validated ego speed when there is none — with
``CandidateSet.selected_index = -1`` and ``fallback_active`` in the diagnostics. Before any valid input
the ego's speed is unknown and no fallback plan is published (the controller stops on its own, for want
of a trajectory); the report says so. It never exits on bad input. Inputs in another frame than
``planner_node.input_frame`` are rejected naming it; input stamps go through the clock model
(``supervision.StampClock``: stale, from the future, out of order). Missed cycles (validated input
stamps further apart than ``input_period_s``, e.g. dropped messages) and cycles whose end-to-end latency
exceeds ``planner.deadline_ms`` count as deadline misses; rejected inputs never touch these counters.

Watchdog: when no cycle ran for ``starvation_timeout_s`` (no input, one of the two missing, stamps that
do not pair up), the node publishes the fallback and reports why (``supervision.explain_starvation``)
every ``input_period_s`` until input returns. Every cycle and every starved period also goes to
``/diagnostics`` (diagnostic_msgs, status "planner": the fault with field and value named, counters),
and a thread publishes ``/heartbeat/planner`` every ``heartbeat.period_s`` (the controller stops when
it ends).

Parameters come from params/bev.yaml, vehicle.yaml, planner.yaml, nodes.yaml (``planner_node.*``,
``heartbeat.*``) and validators.yaml.
"""

from __future__ import annotations

import math
import tempfile
import time

import numpy as np
from nav_msgs.msg import Path
from rad2_core import validators
from rad2_core.bicycle import VehicleParams
from rad2_core.observation import Observation
from rad2_core.supervision import ClockLimits, Seen, StampClock, describe_violations, explain_starvation
from rad2_msgs.msg import BevFeatures, CandidateSet, PlanningDiagnostics, SceneTokens, Trajectory
from rad2_planner.mission_pace import mission_speed_fault
from rad2_planner.planner_guard import (
    DeviationCheck,
    check_plan_kinematics,
    check_plan_output,
    future_tolerance_s,
    point_speeds,
    stopping_trajectory,
)
from rclpy.node import Node
from std_msgs.msg import Float64
from visualization_msgs.msg import MarkerArray

from rad2_ros import conversions as rc
from rad2_ros.nodes.common import (
    CycleStats,
    DiagnosticsReporter,
    Heartbeat,
    Throttle,
    command_qos,
    report_qos,
    run_node,
    sensor_qos,
    setting_qos,
    stop_heartbeat,
)
from rad2_ros.nodes.parameters import declare_parameters

PARAM_FILES = ["bev", "vehicle", "planner", "nodes", "validators"]
PREFIXES = ("bev", "tokens", "vehicle", "planner", "traffic_rules", "safety_envelope", "comfort_limits",
            "drivable_area", "stall_recovery", "mission_pace", "safety_layer", "model", "diffusion",
            "runtime", "planner_node", "heartbeat", "validators")
# Rad2Policy.timings_ms keys reported as stages besides encode and the denoising steps, in pipeline order
POLICY_STAGES = ("encode", "score", "select", "critic", "corrections", "stall_recovery", "mission_pace",
                 "plan_braking", "traffic_rules", "safety_envelope", "comfort_limits", "drivable_area")
# PlanResult.info keys of the safety layer reported on /diagnostics
SAFETY_INFO = ("safety_layer", "corrections", "critic_p", "critic_accepted", "safety_stopped_by_budget")


class PlannerNode(Node):
    def __init__(self, **kwargs):
        super().__init__("planner", **kwargs)
        self.params = declare_parameters(self, PARAM_FILES, prefixes=PREFIXES,
                                         cli_args=kwargs.get("cli_args"))
        p, n = self.params["planner"], self.params["planner_node"]
        self.cfg = n
        self.plan_dt = float(p["plan_dt"])
        self.plan_points = int(p["plan_points"])
        self.frame_id = str(n["frame_id"])
        self.grid = rc.BevGrid.from_params(self.params["bev"])
        self.channels = tuple(self.params["bev"]["channels"])
        self.sizes = rc.TokenSizes.from_params(self.params["tokens"])
        self.stats = CycleStats(deadline_ms=float(p["deadline_ms"]))
        self.throttle = Throttle(2.0)
        self.limits = self.params["validators"]
        self.vehicle = VehicleParams.from_params(self.params)
        self.deviation = DeviationCheck(float(n["deviation_horizon_s"]), float(n["deviation_max_gap_s"]),
                                        float(n["deviation_max_speed_gap_m_s"]))
        self.use_sim_time = bool(self.get_parameter("use_sim_time").value)
        self._say_what_cannot_take_effect()
        self.policy, self.weights = self._make_policy()
        self.backend = str(self.policy.backend_name)
        # the first real cycle would otherwise open the runtime's sessions (seconds, not milliseconds)
        warm_s = self.policy.warm_up()

        self.pub_candidates = self.create_publisher(CandidateSet, "planning/candidates", command_qos())
        self.pub_trajectory = self.create_publisher(Trajectory, "planning/trajectory", command_qos())
        self.pub_path = self.create_publisher(Path, "planning/path", command_qos())
        self.pub_markers = self.create_publisher(MarkerArray, "planning/markers", report_qos(2))
        self.pub_diag = self.create_publisher(PlanningDiagnostics, "planning/diagnostics", report_qos(50))
        self.diagnostics = DiagnosticsReporter(self)
        self._bev: BevFeatures | None = None
        self._tokens: SceneTokens | None = None
        self._seen: dict[str, Seen] = {}  # last received BEV / tokens (stamp, receive time)
        self._last_input_ns: int | None = None
        self._last_cycle_ns: int | None = None  # node clock at the start of the last cycle on paired input
        self._clock_start_ns = 0
        self._previous: tuple[int, np.ndarray] | None = None  # (stamp_ns, selected [T, 2]) of the last plan
        self._previous_speed: float | None = None  # the ego's speed at that plan's stamp
        self._last_fault = ""
        # ego speed of the last validated input and the node time it was taken: a straight fallback stop
        # starts there while it is younger than fallback_max_plan_age_s. None before any, and a speed
        # older than that is stale (the vehicle has since braked or not): no straight stop is timed
        # from it, and the controller stops on its own from the odometry it has
        self._last_speed: tuple[float, int] | None = None
        self.input_frame = str(n["input_frame"])
        # the stamps of the input pairs: the one clock model of stamped inputs, with this node's tolerances
        skew = future_tolerance_s(self.use_sim_time, n["max_stamp_skew_s"], n["max_stamp_skew_sim_s"])
        self.input_clock = StampClock("input.header.stamp", ClockLimits(
            float(n["max_input_age_s"]), float(skew), float(self.limits["clock"]["max_backward_s"])))
        self._first_tick_ns: int | None = None
        self._last_markers_s = -float("inf")
        # markers written as bytes where this distro's Marker has the layout the writer knows
        self._markers_as_bytes = rc.markers_cdr_matches_this_distro()
        if not self._markers_as_bytes:
            self.get_logger().info("planning/markers: this ROS 2's visualization_msgs/Marker differs from "
                                   "the layout rad2 writes as bytes; building marker messages instead")
        self._safety: dict[str, object] = {}  # this cycle's safety-layer info (empty: off or no plan)
        self._safety_corrected = 0  # cycles the safety layer corrected
        self._safety_budget_stops = 0  # cycles whose rejection sampling the round budget stopped
        self._envelope_cycles = 0  # cycles whose plan the longitudinal safety envelope slowed down
        self._envelope_note = ""  # why, the last time it did
        self._drivable_cycles = 0  # cycles whose executed plan left the BEV's drivable area
        self._drivable_note = ""  # where, the last time it did
        self._mission_speed: float | None = None  # m/s (planning/mission_speed); None: no mission speed
        self._mission_note = "none"  # the mission speed in force, or why the last value was refused
        self.create_subscription(Float64, "planning/mission_speed", self._on_mission_speed, setting_qos())
        self.create_subscription(BevFeatures, "perception/bev_features", self._on_bev, sensor_qos())
        self.create_subscription(SceneTokens, "perception/scene_tokens", self._on_tokens, sensor_qos())
        self.create_timer(float(n["input_period_s"]), self._watchdog)
        self.heartbeat = Heartbeat(self, float(self.params["heartbeat"]["period_s"]))
        self.get_logger().info(
            f"planner ready: backend {self.backend}, weights {self.weights}, M={self.policy.num_candidates}, "
            f"K={self.policy.num_steps}, deadline {self.stats.deadline_ms:.0f} ms, warm-up {warm_s:.2f} s"
        )

    # -- set-up ------------------------------------------------------------------------------------
    def _say_what_cannot_take_effect(self) -> None:
        """A value given at launch that this configuration never reads is said to have no effect (the
        start goes on: the value is valid, only moot here)."""
        given = self.params.overridden
        backend = str(self.params["planner"]["backend"])
        moot = {
            "planner.device": (backend != "pytorch",
                               f"it is the pytorch backend's; planner.backend is {backend}"),
            "planner_node.max_stamp_skew_sim_s": (not self.use_sim_time, "it applies on simulated time only "
                                                  "(use_sim_time is false): max_stamp_skew_s does"),
            "planner_node.max_stamp_skew_s": (self.use_sim_time, "on simulated time max_stamp_skew_sim_s "
                                              "applies instead"),
        }
        for name, (no_effect, why) in moot.items():
            if name in given and no_effect:
                self.get_logger().warning(f"{name} = {given[name]!r} has no effect: {why}")

    def _make_policy(self):
        import torch
        from rad2_planner.policy import Rad2Policy, resolve_path

        # intra-op threads of torch (pytorch backend, and the pre/post-processing around ORT): on a
        # small shared CPU, 1 thread is several times faster than spinning threads fighting the sim
        # and the controller for the same cores
        torch.set_num_threads(int(self.cfg["torch_threads"]))
        ckpt = resolve_path(self.params["planner"]["checkpoint_dir"])
        # runtime.onnx_dir names where exported graphs go for a model built in memory; a loaded
        # checkpoint exports beside itself. A value given at launch is what the user wants either way:
        # passed on explicitly, and said to have no effect where nothing is exported.
        onnx_dir = self.params.overridden.get("runtime.onnx_dir")
        if onnx_dir is not None and str(self.params["planner"]["backend"]) == "pytorch":
            self.get_logger().warning(f"runtime.onnx_dir = {onnx_dir!r} has no effect: planner.backend "
                                      "pytorch runs the networks without exporting them")
            onnx_dir = None
        # the node's vehicle.yaml values (the ego box, the tightest turn) go down with the rest
        kwargs = {"vehicle_params": self.params} if onnx_dir is None else {
            "vehicle_params": self.params, "onnx_dir": onnx_dir}
        if (ckpt / "config.json").is_file():
            return Rad2Policy.from_params(self.params, **kwargs), str(ckpt)
        if not self.cfg.get("random_init_if_missing", False):
            raise FileNotFoundError(f"no planner checkpoint in {ckpt} (planner.checkpoint_dir)")
        from rad2_planner.networks import ModelConfig, PlannerModel

        self.get_logger().warning(f"no checkpoint in {ckpt}: RANDOMLY INITIALISED networks (wiring only)")
        model = PlannerModel(ModelConfig.from_params(self.params, self.params))
        # exported graphs of random weights must not land in the checkpoint's ONNX cache
        onnx_dir = onnx_dir or tempfile.mkdtemp(prefix="rad2_random_init_onnx_")
        policy = Rad2Policy(model, params=self.params, onnx_dir=onnx_dir, vehicle_params=self.params)
        return policy, "random-init"

    def destroy_node(self):
        stop_heartbeat(self)
        return super().destroy_node()

    # -- inputs ------------------------------------------------------------------------------------
    def _on_bev(self, msg: BevFeatures) -> None:
        self._bev = msg
        self._seen["bev"] = Seen(rc.time_to_ns(msg.header.stamp), self._now_ns())
        self._try_cycle()

    def _on_mission_speed(self, msg: Float64) -> None:
        value = float(msg.data)
        why = mission_speed_fault(value, self.vehicle.max_speed)
        if why:
            self._mission_speed = None
            self._mission_note = f"refused: planning/mission_speed.data {why}"
            self.get_logger().warning(f"planning/mission_speed.data: {why}; the planner drives without a "
                                      "mission speed until a valid one comes")
            return
        self._mission_speed = None if math.isnan(value) else value
        self._mission_note = "none" if self._mission_speed is None else f"{value:.2f} m/s"
        self.get_logger().info(f"mission speed: {self._mission_note}")

    def _on_tokens(self, msg: SceneTokens) -> None:
        self._tokens = msg
        self._seen["tokens"] = Seen(rc.time_to_ns(msg.header.stamp), self._now_ns())
        self._try_cycle()

    def _clock_started(self) -> bool:
        """On simulated time the node clock reads 0 until the first /clock arrives: no input can be
        judged against it then (a valid stamp would look "in the future") and no plan stamped with it
        is usable, so the node waits (and says so) instead of rejecting inputs or publishing."""
        if not self.use_sim_time or self._now_ns() > 0:
            return True
        if self.throttle("no /clock"):
            self.get_logger().warning("use_sim_time is set but no /clock received yet: waiting, not planning")
        return False

    def _watchdog(self) -> None:
        """Every input period: without a cycle for starvation_timeout_s, fall back and say why."""
        if not self._clock_started():
            return
        now = self._now_ns()
        if self._first_tick_ns is None:
            self._first_tick_ns = now  # grace period after start-up, as after a cycle
        last = self._last_cycle_ns
        since = (now - (self._first_tick_ns if last is None else last)) / 1e9
        if since <= self.cfg["starvation_timeout_s"]:
            return
        reason = explain_starvation(now, self._seen.get("bev"), self._seen.get("tokens"),
                                    self.cfg["sync_tolerance_s"], last)
        self._clock_start_ns = now
        t_start = time.perf_counter()
        self._fallback(0, reason, {}, t_start, self._recent_speed(now))

    def _try_cycle(self) -> None:
        if self._bev is None or self._tokens is None:
            return
        a, b = rc.time_to_ns(self._bev.header.stamp), rc.time_to_ns(self._tokens.header.stamp)
        if abs(a - b) > self.cfg["sync_tolerance_s"] * 1e9:
            # keep the newer one, drop the older (its partner was lost or is late)
            if a < b:
                self._bev = None
            else:
                self._tokens = None
            return
        bev, tokens = self._bev, self._tokens
        self._bev = self._tokens = None
        if self._clock_started():
            self.cycle(bev, tokens)

    def _now_ns(self) -> int:
        return self.get_clock().now().nanoseconds

    # -- one cycle ---------------------------------------------------------------------------------
    def cycle(self, bev_msg: BevFeatures, tokens_msg: SceneTokens) -> None:
        t_start = time.perf_counter()
        self._clock_start_ns = self._last_cycle_ns = self._now_ns()
        stamp_ns = rc.time_to_ns(bev_msg.header.stamp)
        stages: dict[str, float] = {}
        reason = ""
        obs = None
        stamp_valid = False  # only a validated input's stamp may enter latency and deadline counters
        self._safety = {}
        try:
            bev = rc.bev_from_msg(bev_msg, expected_channels=self.channels, expected_grid=self.grid)
            tok = rc.scene_tokens_from_msg(tokens_msg, self.sizes)
            obs = Observation(bev=bev.features, map_polylines=tok.map_polylines, map_mask=tok.map_mask,
                              agents=tok.agents, agents_mask=tok.agents_mask, route=tok.route,
                              route_mask=tok.route_mask, ego_state=tok.ego_state.astype(np.float32),
                              signal_stop=tok.signal_stop.astype(np.float32))
            frames = [(name, frame) for name, frame in (("bev_features", bev.frame_id),
                                                         ("scene_tokens", tok.frame_id))
                      if frame != self.input_frame]
            if frames:
                reason = "rejected input: " + "; ".join(
                    f"{name}.header.frame_id = {frame!r}, expected {self.input_frame!r} "
                    f"(planner_node.input_frame)" for name, frame in frames)
            bad = validators.check_bev(bev.features, self.channels, self.limits)
            bad += validators.check_tokens(tok, self.limits)
            if bad and not reason:
                reason = f"rejected input: implausible {describe_violations(bad)}"
        except rc.MessageValidationError as exc:
            reason = f"rejected input: {exc}"
        if not reason:
            verdict = self.input_clock.check(stamp_ns, self._clock_start_ns)
            stamp_valid = verdict.kind != "unset"
            if verdict.accepted:
                self.input_clock.accept(stamp_ns)
            elif verdict.kind == "stale":
                reason = f"rejected input: stale input: clock fault {verdict.reason}"
            else:
                reason = f"rejected input: clock fault {verdict.reason}"
        stages["preprocess"] = (time.perf_counter() - t_start) * 1e3
        if reason:
            self.stats.reject()
            self._fallback(stamp_ns, reason, stages, t_start, self._safe_speed(obs), stamp_valid)
            return
        self._count_missed_cycles(stamp_ns)
        self._last_speed = (float(obs.ego_state[0]), self._clock_start_ns)

        try:
            mission = {} if self._mission_speed is None else {"target_speeds": [self._mission_speed]}
            result = self.policy.plan(obs, **mission)
            cands = np.asarray(result.candidates, dtype=np.float64)
            if cands.shape[1:] != (self.plan_points, 2) or not np.all(np.isfinite(cands)):
                raise ValueError(f"planner output has shape {cands.shape} or non-finite values")
        except Exception as exc:  # noqa: BLE001 -- any failure of one cycle falls back, the node lives on
            self._fallback(stamp_ns, f"planner failed: {type(exc).__name__}: {exc}", stages, t_start,
                           float(obs.ego_state[0]), True)
            return
        # each denoising step when the backend times them one by one; the fused sampler (one runtime
        # call for all K steps) only has their total
        per_step = any(key.startswith("denoise_") and key != "denoise_total" for key in result.timings_ms)
        for key, ms in result.timings_ms.items():
            denoise = key.startswith("denoise_") and (key != "denoise_total") == per_step
            if key in POLICY_STAGES or denoise:
                stages[key] = float(ms)
        self._note_safety(result.info)

        t_check = time.perf_counter()
        selected = int(result.selected)
        traj = np.asarray(result.trajectory, dtype=np.float64)  # as the rule layer left it (signals)
        ego_speed = float(obs.ego_state[0])
        bad = check_plan_output(traj, self.plan_dt, ego_speed, self.limits, self.vehicle, stamp_ns,
                                self._previous, self.deviation)
        stages["validate_output"] = (time.perf_counter() - t_check) * 1e3
        t_pub = time.perf_counter()
        if bad:
            self.stats.reject()
            self._fallback(stamp_ns, f"rejected plan: implausible {describe_violations(bad)}", stages,
                           t_start, ego_speed, True)
            return
        scores = np.asarray(result.scores, dtype=np.float64)
        score = float(scores[selected]) if math.isfinite(scores[selected]) else float("nan")
        self._publish_plan(stamp_ns, cands, scores, selected, traj, score, int(result.info.get("K", 0)))
        self._previous = (stamp_ns, traj.copy())
        self._previous_speed = ego_speed
        stages["publish"] = (time.perf_counter() - t_pub) * 1e3
        self._report(stamp_ns, stages, t_start, "")

    def _note_safety(self, info: dict) -> None:
        """Keep the safety layer's part of this cycle's ``PlanResult.info`` for the report (and count the
        cycles the safety envelope fired)."""
        if info.get("safety_envelope"):
            self._envelope_cycles += 1
            self._envelope_note = str(info["safety_envelope"])
        if info.get("drivable_area"):
            self._drivable_cycles += 1
            self._drivable_note = str(info["drivable_area"])
        if info.get("safety_layer", "off") == "off":
            return
        self._safety = {key: info[key] for key in SAFETY_INFO if key in info}
        self._safety_corrected += int(info.get("corrections", 0) > 0)
        self._safety_budget_stops += int(bool(info.get("safety_stopped_by_budget", False)))

    def _safe_speed(self, obs: Observation | None) -> float | None:
        """The ego speed a fallback starts from: this input's if plausible, else the last validated one
        while it is recent (None: none known)."""
        if obs is not None:
            speed = float(obs.ego_state[0])
            tok = self.limits["tokens"]
            if -float(tok["max_reverse_speed_m_s"]) <= speed <= float(tok["max_abs_speed_m_s"]):
                return speed
        return self._recent_speed(self._now_ns())

    def _recent_speed(self, now_ns: int) -> float | None:
        """The last validated ego speed if taken within fallback_max_plan_age_s of ``now_ns``, else None:
        a fallback stop timed from an older speed would be tracked from a state the vehicle left long
        ago (after a 2 s fault, a stop from 8 m/s for a vehicle the controller has slowed to 3 m/s)."""
        if self._last_speed is None:
            return None
        speed, taken_ns = self._last_speed
        return speed if 0 <= now_ns - taken_ns <= self.cfg["fallback_max_plan_age_s"] * 1e9 else None

    def _count_missed_cycles(self, stamp_ns: int) -> None:
        last = self._last_input_ns
        if last is not None and stamp_ns > last:
            gap = (stamp_ns - last) / 1e9
            missed = int(round(gap / self.cfg["input_period_s"])) - 1
            if missed > 0:
                self.stats.deadline_miss_count += missed
                if self.throttle("missed"):
                    self.get_logger().warning(
                        f"{missed} planning cycle(s) missed: input stamps {gap * 1e3:.0f} ms apart "
                        f"(total misses {self.stats.deadline_miss_count})")
        if last is None or stamp_ns != last:  # also when time jumps back (bag loop, new episode)
            self._last_input_ns = stamp_ns

    def _publish_plan(self, stamp_ns, cands, scores, selected, traj, score, k, fallback=False) -> None:
        yaw = rc.headings_from_points(traj)
        speed = point_speeds(traj, self.plan_dt)
        # The executed plan first: the controller waits for it, the rest is for people and recorders.
        self.pub_trajectory.publish(rc.trajectory_to_msg(
            traj, self.plan_dt, stamp_ns, self.frame_id, yaw=yaw, speed=speed, score=score))
        self.pub_path.publish(rc.trajectory_to_path_cdr(traj, self.plan_dt, stamp_ns, self.frame_id))
        # The candidate set and the markers cost most of the publish time (M messages, M x T points):
        # built only while someone subscribes (what a subscriber receives does not change), markers at
        # most planner_node.markers_rate_hz; the candidate set goes out as bytes written straight from
        # the arrays (rc.candidate_set_to_cdr: 0.3 ms where building the message objects took 2.8 ms).
        if self.pub_candidates.get_subscription_count() > 0:
            self.pub_candidates.publish(rc.candidate_set_to_cdr(
                cands, scores, -1 if fallback else selected, self.plan_dt, stamp_ns, self.frame_id, k))
        if self.cfg["markers"] and self.pub_markers.get_subscription_count() > 0:
            now = time.monotonic()
            if now - self._last_markers_s >= 1.0 / float(self.cfg["markers_rate_hz"]):
                self._last_markers_s = now
                build = rc.candidate_markers_to_cdr if self._markers_as_bytes else rc.candidate_markers_to_msg
                self.pub_markers.publish(build(cands, scores, selected, stamp_ns, self.frame_id))

    def _fallback(self, input_stamp_ns: int, reason: str, stages, t_start: float, speed: float | None,
                  stamp_valid: bool = False) -> None:
        """Publish the safe stop and report the cycle as a fallback. Without a recent plan to brake along
        and without any known ego speed (no valid input yet) no stop can be timed: a straight stop from
        an assumed 0 m/s is a plan at standstill, which the controller rejects at speed. Then nothing is
        published; the report says so and the controller stops on its own (no trajectory)."""
        if self.throttle(reason[:48]):
            what = ("publishing a fallback stop" if speed is not None or self._previous is not None else
                    "no fallback stop (the ego's speed is unknown now)")
            self.get_logger().error(f"cycle at stamp {input_stamp_ns / 1e9:.3f} s: {reason}; {what} "
                                    f"(rejected inputs: {self.stats.rejected_input_count})")
        t_pub = time.perf_counter()
        now_ns = self._now_ns()
        max_age_ns = self.cfg["fallback_max_plan_age_s"] * 1e9
        stop = None
        if self._previous is not None and now_ns - self._previous[0] < max_age_ns:
            prev_stamp, prev = self._previous
            elapsed = (now_ns - prev_stamp) / 1e9
            stop = stopping_trajectory(prev, self.plan_dt, self.plan_points, elapsed, speed,
                                       self.cfg["fallback_decel"])
            stamp = prev_stamp
            # The previous plan was judged over its first kinematics_horizon_s only; shifted by the
            # elapsed time its tail (a kink, a hook) can come into that horizon, and the controller would
            # reject the fallback itself. Then stop straight ahead instead.
            # The fallback starts where that plan did: judged from the ego's speed at its stamp, within
            # the vehicle's limits like any plan.
            if check_plan_kinematics(stop, self.plan_dt, self.limits, self.vehicle, self._previous_speed):
                stop = None
        if stop is None and speed is None:
            stages["publish"] = (time.perf_counter() - t_pub) * 1e3
            unknown = ("; no fallback plan published: the ego's speed is unknown now (no valid input "
                       f"within {self.cfg['fallback_max_plan_age_s']:g} s), the controller stops on its own")
            self._report(input_stamp_ns, stages, t_start, reason + unknown, stamp_valid)
            return
        if stop is None:
            stop = stopping_trajectory(None, self.plan_dt, self.plan_points, 0.0, speed,
                                       self.cfg["fallback_decel"])
            stamp = now_ns
        # the candidate set of a fallback cycle says so: selected_index -1
        nan = float("nan")
        self._publish_plan(stamp, stop[None], np.array([nan]), 0, stop, nan, 0, fallback=True)
        stages["publish"] = (time.perf_counter() - t_pub) * 1e3
        self._report(input_stamp_ns, stages, t_start, reason, stamp_valid)

    def _report(self, input_stamp_ns: int, stages, t_start: float, fallback_reason: str,
                stamp_valid: bool = True) -> None:
        now_ns = self._now_ns()
        total_ms = (time.perf_counter() - t_start) * 1e3
        # End-to-end = (node clock at the cycle start - input stamp) + wall time of the cycle. With the
        # system clock this is exactly now - stamp; with /clock (simulation, replay) the simulated
        # clock only advances in steps, so the in-cycle part is measured on the wall clock. An input
        # whose stamp was not validated has no end-to-end latency (NaN: it counts no deadline miss).
        e2e_ms = (self._clock_start_ns - input_stamp_ns) / 1e6 + total_ms if stamp_valid else math.nan
        rep = self.stats.record(stages, total_ms, e2e_ms, fallback_reason)
        self.pub_diag.publish(rc.planning_diagnostics_to_msg(
            rep.stages_ms, node=self.get_name(), backend=self.backend, stamp_ns=now_ns,
            input_stamp_ns=max(input_stamp_ns, 0), total_ms=rep.total_ms,
            end_to_end_ms=rep.end_to_end_ms if math.isfinite(rep.end_to_end_ms) else -1.0,
            deadline_missed=rep.deadline_missed, cycle_count=rep.cycle_count,
            deadline_miss_count=self.stats.deadline_miss_count,
            rejected_input_count=rep.rejected_input_count, fallback_active=rep.fallback_active,
            fallback_reason=rep.fallback_reason[:500]))
        if fallback_reason:
            self._last_fault = fallback_reason
        self.diagnostics.publish(
            "error" if fallback_reason else "ok",
            fallback_reason or "planning", {
                "cycle_count": rep.cycle_count, "fallback_active": rep.fallback_active,
                "rejected_input_count": rep.rejected_input_count,
                "deadline_miss_count": self.stats.deadline_miss_count,
                "end_to_end_ms": f"{rep.end_to_end_ms:.1f}", "last_fault": self._last_fault[:300],
                "safety_envelope_cycle_count": self._envelope_cycles,
                "safety_envelope_last": self._envelope_note[:300],
                "drivable_area_cycle_count": self._drivable_cycles,
                "drivable_area_last": self._drivable_note[:300],
                "mission_speed": self._mission_note[:300],
                **self._safety_values()})
        if rep.deadline_missed and self.throttle("deadline"):
            self.get_logger().warning(f"deadline missed: {rep.end_to_end_ms:.1f} ms end-to-end "
                                      f"(> {self.stats.deadline_ms:.0f} ms), cycle {total_ms:.1f} ms")
        every = int(self.cfg["report_every"])
        if every and rep.cycle_count % every == 0:
            q = self.stats.percentiles()
            self.get_logger().info(
                f"{rep.cycle_count} cycles: end-to-end p50 {q['p50']:.1f} p90 {q['p90']:.1f} "
                f"p99 {q['p99']:.1f} max {q['max']:.1f} ms; deadline misses "
                f"{self.stats.deadline_miss_count}, rejected {self.stats.rejected_input_count}")


    def _safety_values(self) -> dict[str, object]:
        """The safety layer's key-values on /diagnostics (none while the layer is off)."""
        if self.policy.safety.mode == "off":
            return {}
        values: dict[str, object] = {"safety_layer": self.policy.safety.mode}
        for key in SAFETY_INFO[1:]:  # this cycle's (absent on a fallback cycle)
            value = self._safety.get(key)
            if value is not None:
                values[key] = f"{value:.4f}" if key == "critic_p" else value
        values["safety_corrected_cycle_count"] = self._safety_corrected
        values["safety_budget_stop_count"] = self._safety_budget_stops
        return values


def main(args=None) -> int:
    return run_node(PlannerNode, args)


if __name__ == "__main__":
    raise SystemExit(main())
