"""Content and protocol of the DDS round-trip check of every rad2_msgs type (rad2 graph smoke).

The content (a BEV tensor with a road, lanes and moving agents, scene tokens, candidates, ...) comes
from `sample_arrays(bev_params, seed)`, which needs no ROS; `build_messages` encodes it with
rad2_ros.conversions, `decode_content` decodes a received message into the layout of
`expected_content`, and `compare_content` lists the differences. The probe process prints its results
as one ``RESULT_PREFIX`` JSON line (`parse_probe_output`). The tests of the converters and of the DDS
exchange compare against the same content, which is why it lives here and not in the tool.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

import numpy as np
from rad2_core.tokens import MAP_FEATURES

MESSAGE_TYPES = (
    "BevFeatures",
    "SceneTokens",
    "MapPolyline",
    "AgentState",
    "PerceptionInputs",
    "Trajectory",
    "CandidateSet",
    "ControlCommand",
    "StageLatency",
    "PlanningDiagnostics",
)
REQUEST_PREFIX = "/rad2_smoke/request/"
REPLY_PREFIX = "/rad2_smoke/reply/"
READY_LINE = "rad2-smoke-echo ready"
RESULT_PREFIX = "RAD2_SMOKE_RESULT "
# Values derived from headings (cos/sin after atan2 -> float32 -> cos/sin) differ by float rounding.
HEADING_ATOL = 2e-6
STAMP_NS = 1_732_000_000_123_456_789


# --------------------------------------------------------------------------------------------------
# Content (no ROS needed)
# --------------------------------------------------------------------------------------------------


def _bev_content(rng: np.random.Generator, channels: list[str], grid: dict[str, Any]) -> np.ndarray:
    """A plausible raster: a 3-lane road with a side street, lane lines, the route and three agents
    with their occupancy history and velocities, in the conventions.md channel layout."""
    height, width, res = int(grid["height"]), int(grid["width"]), float(grid["resolution_m"])
    xs = float(grid["origin_x"]) + (np.arange(width) + 0.5) * res  # cell centres, ego frame
    ys = float(grid["origin_y"]) + (np.arange(height) + 0.5) * res
    gx, gy = np.meshgrid(xs, ys)  # [H, W]
    lane_width = 3.5
    road = (np.abs(gy) < 1.5 * lane_width) | (np.abs(gx - 20.0) < lane_width)
    layers: dict[str, np.ndarray] = {name: np.zeros((height, width), np.float32) for name in channels}

    def put(name: str, mask: np.ndarray, value: Any) -> None:
        if name in layers:
            layers[name][mask] = value[mask] if isinstance(value, np.ndarray) else value

    put("drivable_area", road, 1.0)
    put(
        "lane_centerline",
        np.any([np.abs(gy - c) < res / 2 for c in (-lane_width, 0.0, lane_width)], axis=0),
        1.0,
    )
    put("lane_boundary", np.any([np.abs(np.abs(gy) - b) < res / 2 for b in (0.5, 1.5)], axis=0) & road, 1.0)
    put("route", (np.abs(gy) < res / 2) & (gx > 0), 1.0)
    put("speed_limit", road, np.float32(13.4))
    agents = [  # x, y, yaw, speed, length, width
        (12.0 + rng.normal(0, 0.3), lane_width, 0.0, 8.3 + rng.normal(0, 0.5), 4.6, 1.9),
        (-9.0, -lane_width, 0.02, 11.7, 4.9, 2.0),
        (20.0, 14.0 + rng.normal(0, 0.3), -math.pi / 2, 2.4, 4.2, 1.8),
    ]
    for x, y, yaw, speed, length, width_m in agents:
        vx, vy = speed * math.cos(yaw), speed * math.sin(yaw)
        for name, back_s in (("agents_t0", 0.0), ("agents_t-5", 0.5), ("agents_t-10", 1.0)):
            cx, cy = x - vx * back_s, y - vy * back_s
            dx, dy = gx - cx, gy - cy
            along = dx * math.cos(yaw) + dy * math.sin(yaw)
            across = -dx * math.sin(yaw) + dy * math.cos(yaw)
            box = (np.abs(along) <= length / 2) & (np.abs(across) <= width_m / 2)
            put(name, box, 1.0)
            if back_s == 0.0:
                put("agent_velocity_x", box, np.float32(vx))
                put("agent_velocity_y", box, np.float32(vy))
    return np.stack([layers[name] for name in channels]).astype(np.float32)


def sample_arrays(
    params: dict[str, Any], seed: int = 0, bev_channels: int | None = None, bev_size: int | None = None
) -> dict[str, Any]:
    """Deterministic content for every message type, as the numpy-side values the converters take.

    The BEV grid, channels and token sizes come from ``params`` (params/bev.yaml as loaded);
    `bev_channels` / `bev_size` override the channel count (extra channels get noise) and the square
    grid size."""
    rng = np.random.default_rng(seed)
    grid = dict(params["bev"])
    if bev_size is not None:
        grid["height"] = grid["width"] = int(bev_size)
    channels = list(params["bev"]["channels"])
    if bev_channels is not None:
        channels = (channels + [f"extra_{k}" for k in range(max(0, bev_channels - len(channels)))])[
            :bev_channels
        ]
    bev = _bev_content(rng, channels, grid)
    for c, name in enumerate(channels):
        if name.startswith("extra_"):
            bev[c] = rng.normal(0, 1, bev[c].shape).astype(np.float32)

    tokens = params["tokens"]
    n_map, n_pts = int(tokens["map"]["num_polylines"]), int(tokens["map"]["points_per_polyline"])
    n_agents, n_route = int(tokens["agents"]["num_agents"]), int(tokens["route"]["num_points"])
    valid_map, valid_agents, valid_route = min(n_map, 23), min(n_agents, 11), n_route
    polylines = np.zeros((n_map, n_pts, MAP_FEATURES), np.float32)
    s = np.linspace(-20.0, 40.0, n_pts)
    for m in range(valid_map):
        offset, curvature = rng.uniform(-20, 20), rng.uniform(-0.01, 0.01)
        x, y = s, offset + curvature * s**2
        heading = np.arctan2(2 * curvature * s, np.ones_like(s))
        polylines[m] = np.stack(
            [
                x,
                y,
                np.cos(heading),
                np.sin(heading),
                np.full_like(s, rng.choice([8.3, 13.4])),
                np.full_like(s, float(m % 3 == 0)),
                np.full_like(s, (0.0, 0.5, 1.0, 0.0)[m % 4]),  # signal_stop: none, yellow, red, green
                np.full_like(s, float(m % 4 == 3)),  # signal_go
            ],
            axis=1,
        )
    agents = np.zeros((n_agents, 10), np.float32)
    kinds = rng.integers(0, 3, valid_agents)  # 0 vehicle, 1 pedestrian, 2 cyclist
    for a in range(valid_agents):
        yaw = rng.uniform(-math.pi, math.pi)
        speed = rng.uniform(0, 15)
        agents[a] = (
            rng.uniform(-30, 50),
            rng.uniform(-20, 20),
            math.cos(yaw),
            math.sin(yaw),
            speed * math.cos(yaw),
            speed * math.sin(yaw),
            *((4.5, 1.9) if kinds[a] == 0 else (0.7, 0.6)),
            float(kinds[a] == 0),
            float(kinds[a] != 0),
        )
    route_s = np.arange(n_route) * float(tokens["route"]["spacing_m"])
    route_heading = 0.004 * route_s
    route = np.stack([route_s, 0.002 * route_s**2, np.cos(route_heading), np.sin(route_heading)], axis=1)

    m_cand, t_plan = 32, 8
    speeds = rng.uniform(0, 12, m_cand)[:, None]
    steps = np.arange(1, t_plan + 1)[None, :] * 0.5
    lateral = rng.normal(0, 0.15, (m_cand, 1)) * steps**2
    candidates = np.stack([speeds * steps, lateral], axis=-1)
    return {
        "bev": {"features": bev, "grid": grid, "channel_names": channels},
        "tokens": {
            "map_polylines": polylines,
            "map_mask": np.arange(n_map) < valid_map,
            "lane_ids": np.where(np.arange(n_map) < valid_map, 1000 + np.arange(n_map), -1).astype(np.int64),
            "agents": agents,
            "agents_mask": np.arange(n_agents) < valid_agents,
            "agent_ids": np.where(np.arange(n_agents) < valid_agents, 7 + np.arange(n_agents), -1).astype(
                np.int64
            ),
            "agent_types": np.where(
                np.arange(n_agents) < valid_agents, np.pad(kinds, (0, n_agents - valid_agents)), 3
            ).astype(np.uint8),
            "route": route.astype(np.float32),
            "route_mask": np.arange(n_route) < valid_route,
            "ego_state": np.array([8.7, -0.35, 0.021, 0.013], np.float32),
        },
        "candidates": {
            "candidates": candidates,
            "scores": rng.uniform(0, 1, m_cand),
            "selected": 5,
            "dt": 0.5,
            "denoising_steps": 10,
        },
        "trajectory": {
            "points": candidates[5],
            "dt": 0.5,
            "yaw": rng.uniform(-0.2, 0.2, t_plan).astype(np.float32),
            "speed": rng.uniform(0, 12, t_plan).astype(np.float32),
            "score": 0.8125,
        },
        "command": {
            "acceleration": -1.25,
            "steering_angle": 0.0375,
            "steering_rate": -0.0625,
            "target_speed": 8.5,
            "emergency_stop": True,
            "reason": "stale plan (0.42 s old)",
        },
        "diagnostics": {
            "stage_ms": {"preprocess": 1.5, "encode": 6.25, "denoise_0": 3.125, "score": 2.0, "select": 0.25},
            "node": "planner_node",
            "backend": "onnxruntime",
            "end_to_end_ms": 21.5,
            "deadline_missed": False,
            "cycle_count": 1234,
            "deadline_miss_count": 3,
            "rejected_input_count": 1,
            "fallback_active": True,
            "fallback_reason": "deadline missed twice",
        },
    }


def expected_content(type_name: str, arrays: dict[str, Any]) -> dict[str, np.ndarray]:
    """What decoding a received `type_name` message must give back (flat dict of arrays)."""
    tok, cand, traj = arrays["tokens"], arrays["candidates"], arrays["trajectory"]
    if type_name == "BevFeatures":
        g = arrays["bev"]["grid"]
        return {
            "features": arrays["bev"]["features"],
            "grid": np.array(
                [g["resolution_m"], g["height"], g["width"], g["origin_x"], g["origin_y"]], np.float64
            ),
            "channel_names": np.array(arrays["bev"]["channel_names"]),
            "stamp_ns": np.array(STAMP_NS),
        }
    if type_name == "SceneTokens":
        return {k: np.asarray(v) for k, v in tok.items()} | {"stamp_ns": np.array(STAMP_NS)}
    if type_name == "MapPolyline":
        return {"polyline": tok["map_polylines"][0], "lane_id": np.array(tok["lane_ids"][0])}
    if type_name in ("AgentState", "PerceptionInputs"):
        count = 1 if type_name == "AgentState" else int(tok["agents_mask"].sum())
        rows = tok["agents"][:count].astype(np.float64)
        return {
            "ids": tok["agent_ids"][:count],
            "types": tok["agent_types"][:count],
            "pose": np.stack([rows[:, 0], rows[:, 1], np.cos(np.arctan2(rows[:, 3], rows[:, 2]))], axis=1),
            "box_velocity": rows[:, 4:8].astype(np.float32),
        }
    if type_name == "Trajectory":
        return {
            "points": np.asarray(traj["points"]),
            "dt": np.array(traj["dt"], np.float32),
            "yaw": traj["yaw"],
            "speed": traj["speed"],
            "score": np.array(traj["score"], np.float32),
        }
    if type_name == "CandidateSet":
        return {
            "candidates": cand["candidates"],
            "scores": cand["scores"].astype(np.float32),
            "selected": np.array(cand["selected"]),
            "dt": np.array(cand["dt"], np.float32),
            "denoising_steps": np.array(cand["denoising_steps"]),
        }
    if type_name == "ControlCommand":
        c = arrays["command"]
        return {
            "values": np.array(
                [c["acceleration"], c["steering_angle"], c["steering_rate"], c["target_speed"]], np.float32
            ),
            "emergency_stop": np.array(c["emergency_stop"]),
            "reason": np.array(c["reason"]),
        }
    if type_name in ("StageLatency", "PlanningDiagnostics"):
        d = arrays["diagnostics"]
        stages = (
            d["stage_ms"] if type_name == "PlanningDiagnostics" else dict(list(d["stage_ms"].items())[:1])
        )
        out = {"stage_names": np.array(list(stages)), "stage_ms": np.array(list(stages.values()), np.float32)}
        if type_name == "PlanningDiagnostics":
            out |= {
                "counts": np.array([d["cycle_count"], d["deadline_miss_count"], d["rejected_input_count"]]),
                "flags": np.array([d["deadline_missed"], d["fallback_active"]]),
                "text": np.array([d["node"], d["backend"], d["fallback_reason"]]),
                "total_ms": np.array(sum(stages.values()), np.float32),
            }
        return out
    raise KeyError(f"unknown message type {type_name!r}; known: {MESSAGE_TYPES}")


def compare_content(
    expected: dict[str, np.ndarray], received: dict[str, np.ndarray], approx_keys: tuple[str, ...] = ()
) -> list[str]:
    """Mismatch descriptions (empty: identical; keys in approx_keys within HEADING_ATOL)."""
    problems = []
    for key, want in expected.items():
        if key not in received:
            problems.append(f"{key}: missing")
            continue
        got = np.asarray(received[key])
        want = np.asarray(want)
        if got.shape != want.shape:
            problems.append(f"{key}: shape {got.shape} != {want.shape}")
        elif want.dtype.kind in "fc" and key in approx_keys:
            err = float(np.max(np.abs(got.astype(np.float64) - want))) if want.size else 0.0
            if err > HEADING_ATOL:
                problems.append(f"{key}: max abs error {err:.3g} > {HEADING_ATOL}")
        elif not np.array_equal(got.astype(want.dtype) if want.dtype.kind in "fc" else got, want):
            problems.append(f"{key}: values differ")
    return problems


# Keys whose values pass through atan2/cos/sin (headings), compared with HEADING_ATOL.
APPROX_KEYS = ("map_polylines", "agents", "route", "polyline", "pose")


# --------------------------------------------------------------------------------------------------
# Messages (imports rad2_msgs / ros_conversions only when called: the content above needs no ROS)
# --------------------------------------------------------------------------------------------------


def build_messages(arrays: dict[str, Any]) -> dict[str, Any]:
    from rad2_msgs.msg import PerceptionInputs

    from rad2_ros import conversions as rc

    bev = arrays["bev"]
    tok = arrays["tokens"]
    token_arrays = rc.SceneTokenArrays(
        tok["map_polylines"],
        tok["map_mask"],
        tok["agents"],
        tok["agents_mask"],
        tok["route"],
        tok["route_mask"],
        tok["ego_state"],
        STAMP_NS,
        rc.EGO_FRAME,
        tok["lane_ids"],
        tok["agent_ids"],
        tok["agent_types"],
    )
    scene = rc.scene_tokens_to_msg(token_arrays)
    cand, traj, d = arrays["candidates"], arrays["trajectory"], arrays["diagnostics"]
    diagnostics = rc.planning_diagnostics_to_msg(
        d["stage_ms"],
        node=d["node"],
        backend=d["backend"],
        stamp_ns=STAMP_NS,
        input_stamp_ns=STAMP_NS - 20_000_000,
        end_to_end_ms=d["end_to_end_ms"],
        deadline_missed=d["deadline_missed"],
        cycle_count=d["cycle_count"],
        deadline_miss_count=d["deadline_miss_count"],
        rejected_input_count=d["rejected_input_count"],
        fallback_active=d["fallback_active"],
        fallback_reason=d["fallback_reason"],
    )
    perception = PerceptionInputs(header=scene.header, agents=list(scene.agents))
    return {
        "BevFeatures": rc.bev_to_msg(
            bev["features"], rc.BevGrid.from_params(bev["grid"]), bev["channel_names"], STAMP_NS
        ),
        "SceneTokens": scene,
        "MapPolyline": scene.map_polylines[0],
        "AgentState": scene.agents[0],
        "PerceptionInputs": perception,
        "Trajectory": rc.trajectory_to_msg(
            traj["points"], traj["dt"], STAMP_NS, yaw=traj["yaw"], speed=traj["speed"], score=traj["score"]
        ),
        "CandidateSet": rc.candidate_set_to_msg(
            cand["candidates"],
            cand["scores"],
            cand["selected"],
            cand["dt"],
            STAMP_NS,
            denoising_steps=cand["denoising_steps"],
        ),
        "ControlCommand": rc.control_command_to_msg(
            rc.ControlCommandValues(**arrays["command"], stamp_ns=STAMP_NS)
        ),
        "StageLatency": diagnostics.stages[0],
        "PlanningDiagnostics": diagnostics,
    }


def decode_content(type_name: str, msg: Any, sizes: Any) -> dict[str, np.ndarray]:
    """Decode a received message with ros_conversions into the layout of expected_content()."""
    from rad2_msgs.msg import PerceptionInputs, PlanningDiagnostics, SceneTokens

    from rad2_ros import conversions as rc

    if type_name == "BevFeatures":
        frame = rc.bev_from_msg(msg)
        g = frame.grid
        return {
            "features": frame.features,
            "channel_names": np.array(frame.channel_names),
            "grid": np.array([g.resolution, g.height, g.width, g.origin_x, g.origin_y], np.float64),
            "stamp_ns": np.array(frame.stamp_ns),
        }
    if type_name == "SceneTokens":
        t = rc.scene_tokens_from_msg(msg, sizes)
        arrays = {f.name: getattr(t, f.name) for f in dataclasses.fields(t) if f.name != "frame_id"}
        return arrays | {"stamp_ns": np.array(t.stamp_ns)}
    if type_name == "MapPolyline":
        t = rc.scene_tokens_from_msg(SceneTokens(map_polylines=[msg]), sizes)
        return {"polyline": t.map_polylines[0], "lane_id": np.array(t.lane_ids[0])}
    if type_name in ("AgentState", "PerceptionInputs"):
        agents, _, _ = rc.perception_inputs_from_msg(
            msg if type_name == "PerceptionInputs" else PerceptionInputs(agents=[msg])
        )
        return {
            "ids": agents.ids,
            "types": agents.types,
            "pose": np.stack([agents.x, agents.y, np.cos(agents.yaw)], axis=1),
            "box_velocity": np.stack([agents.vx, agents.vy, agents.length, agents.width], axis=1).astype(
                np.float32
            ),
        }
    if type_name == "Trajectory":
        t = rc.trajectory_from_msg(msg)
        return {
            "points": t.points,
            "dt": np.array(t.dt, np.float32),
            "yaw": t.yaw,
            "speed": t.speed,
            "score": np.array(t.score, np.float32),
        }
    if type_name == "CandidateSet":
        c = rc.candidate_set_from_msg(msg)
        return {
            "candidates": c.candidates,
            "scores": c.scores.astype(np.float32),
            "selected": np.array(c.selected),
            "dt": np.array(c.dt, np.float32),
            "denoising_steps": np.array(c.denoising_steps),
        }
    if type_name == "ControlCommand":
        c = rc.control_command_from_msg(msg)
        return {
            "values": np.array(
                [c.acceleration, c.steering_angle, c.steering_rate, c.target_speed], np.float32
            ),
            "emergency_stop": np.array(c.emergency_stop),
            "reason": np.array(c.reason),
        }
    if type_name in ("StageLatency", "PlanningDiagnostics"):
        wrapped = (
            msg if type_name == "PlanningDiagnostics" else PlanningDiagnostics(stages=[msg], total_ms=0.0)
        )
        d = rc.planning_diagnostics_from_msg(wrapped)
        out = {
            "stage_names": np.array(list(d["stages"])),
            "stage_ms": np.array(list(d["stages"].values()), np.float32),
        }
        if type_name == "PlanningDiagnostics":
            out |= {
                "counts": np.array([d["cycle_count"], d["deadline_miss_count"], d["rejected_input_count"]]),
                "flags": np.array([d["deadline_missed"], d["fallback_active"]]),
                "text": np.array([d["node"], d["backend"], d["fallback_reason"]]),
                "total_ms": np.array(d["total_ms"], np.float32),
            }
        return out
    raise KeyError(type_name)


def parse_probe_output(text: str) -> list[dict]:
    for line in text.splitlines():
        if line.startswith(RESULT_PREFIX):
            return json.loads(line[len(RESULT_PREFIX) :])
    raise ValueError("probe printed no result line")
