"""Plans: ``Trajectory`` (the executed plan), ``CandidateSet`` (every candidate of a cycle with its
score and the selected index) and ``nav_msgs/Path`` (the plan for RViz and standard consumers).

The serialized forms the planner publishes straight from the arrays are in :mod:`.cdr`; the field
checks here (``candidate_set_fields``, ``path_poses``) are shared with them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from geometry_msgs.msg import Point, PoseStamped
from nav_msgs.msg import Path
from rad2_core.geometry import yaw_to_quaternion
from rad2_datasets.bags import time_to_ns
from rad2_msgs.msg import CandidateSet, Trajectory

from rad2_ros.conversions.common import (
    EGO_FRAME,
    NS_PER_S,
    as_array,
    check_finite,
    check_scalar,
    f32,
    fail,
    float32_array,
    headings_from_points,
    make_header,
    ns_to_time,
    orientation_to_yaw,
)


@dataclass
class TrajectoryArrays:
    """A decoded Trajectory: points [T, 2] at stamp + (k+1)*dt; yaw/speed [T] or None when absent."""

    points: np.ndarray
    dt: float
    stamp_ns: int = 0
    frame_id: str = EGO_FRAME
    yaw: np.ndarray | None = None
    speed: np.ndarray | None = None
    score: float = float("nan")


def check_dt(kind: str, dt: float) -> float:
    dt = check_scalar(kind, "dt", dt)
    if dt <= 0:
        raise fail(kind, "dt", f"is {dt}, expected > 0 s")
    return dt


def check_score(kind: str, field_name: str, score: float) -> float:
    score = float(score)
    if not (math.isnan(score) or 0.0 <= score <= 1.0):
        raise fail(kind, field_name, f"is {score}, expected a value in [0, 1] or NaN (not scored)")
    return score


def trajectory_to_msg(
    points: np.ndarray,
    dt: float,
    stamp_ns: int = 0,
    frame_id: str = EGO_FRAME,
    yaw: np.ndarray | None = None,
    speed: np.ndarray | None = None,
    score: float = float("nan"),
) -> Trajectory:
    kind = "Trajectory"
    pts = as_array(kind, "points", points, (None, 2), np.float64)
    msg = Trajectory()
    msg.header = make_header(stamp_ns, frame_id)
    msg.dt = f32(check_dt(kind, dt))
    msg.points = [Point(x=float(x), y=float(y), z=0.0) for x, y in pts]
    if yaw is not None:
        msg.yaw = float32_array(as_array(kind, "yaw", yaw, (len(pts),)))
    if speed is not None:
        msg.speed = float32_array(as_array(kind, "speed", speed, (len(pts),)))
    msg.score = f32(check_score(kind, "score", score))
    return msg


def trajectory_from_msg(msg: Trajectory, kind: str = "Trajectory") -> TrajectoryArrays:
    dt = check_dt(kind, msg.dt)
    pts = np.array([(p.x, p.y) for p in msg.points], dtype=np.float64).reshape(-1, 2)
    check_finite(kind, "points", pts)
    optional = {}
    for name in ("yaw", "speed"):
        values = getattr(msg, name)
        if len(values) == 0:
            optional[name] = None
            continue
        if len(values) != len(pts):
            raise fail(kind, name, f"has {len(values)} values for {len(pts)} points (expected equal or 0)")
        arr = np.asarray(values, dtype=np.float32)
        check_finite(kind, name, arr)
        optional[name] = arr
    score = check_score(kind, "score", msg.score)
    return TrajectoryArrays(
        pts,
        dt,
        time_to_ns(msg.header.stamp),
        str(msg.header.frame_id),
        optional["yaw"],
        optional["speed"],
        score,
    )


@dataclass
class CandidateSetArrays:
    """A planning cycle's candidates [M, T, 2], scores [M], selected index (-1: fallback), dt."""

    candidates: np.ndarray
    scores: np.ndarray
    selected: int
    dt: float
    stamp_ns: int = 0
    frame_id: str = EGO_FRAME
    denoising_steps: int = 0


def candidate_set_fields(candidates, scores, selected,
                          denoising_steps) -> tuple[np.ndarray, np.ndarray, int]:
    """Validated (candidates [M, T, 2] float64, scores [M] float64, selected) of a CandidateSet."""
    kind = "CandidateSet"
    cands = as_array(kind, "candidates", candidates, (None, None, 2), np.float64)
    num = cands.shape[0]
    score_arr = np.asarray(scores, dtype=np.float64)
    if score_arr.shape != (num,):
        raise fail(
            kind, "scores", f"has shape {list(score_arr.shape)}, expected [{num}] (one per candidate)"
        )
    for m, score in enumerate(score_arr):
        check_score(kind, f"candidates[{m}].score", float(score))
    selected = int(selected)
    if not -1 <= selected < num:
        raise fail(kind, "selected_index", f"is {selected}, expected -1..{num - 1}")
    if int(denoising_steps) < 0:
        raise fail(kind, "denoising_steps", f"is {denoising_steps}, expected >= 0")
    return cands, score_arr, selected


def candidate_set_to_msg(
    candidates: np.ndarray,
    scores: np.ndarray,
    selected: int,
    dt: float,
    stamp_ns: int = 0,
    frame_id: str = EGO_FRAME,
    denoising_steps: int = 0,
) -> CandidateSet:
    cands, score_arr, selected = candidate_set_fields(candidates, scores, selected, denoising_steps)
    msg = CandidateSet()
    msg.header = make_header(stamp_ns, frame_id)
    msg.candidates = [
        trajectory_to_msg(cands[m], dt, stamp_ns, frame_id, score=float(score_arr[m]))
        for m in range(cands.shape[0])
    ]
    msg.selected_index = selected
    msg.denoising_steps = int(denoising_steps)
    return msg


def candidate_set_from_msg(msg: CandidateSet) -> CandidateSetArrays:
    kind = "CandidateSet"
    num = len(msg.candidates)
    if not -1 <= msg.selected_index < num:
        raise fail(
            kind, "selected_index", f"is {msg.selected_index}, expected -1..{num - 1} for {num} candidates"
        )
    trajectories = [
        trajectory_from_msg(t, kind=f"{kind}.candidates[{m}]") for m, t in enumerate(msg.candidates)
    ]
    lengths = {len(t.points) for t in trajectories}
    if len(lengths) > 1:
        raise fail(kind, "candidates", f"have different point counts {sorted(lengths)}, expected one T")
    dts = {t.dt for t in trajectories}
    if len(dts) > 1:
        raise fail(kind, "candidates.dt", f"differ {sorted(dts)}, expected one dt")
    length = lengths.pop() if lengths else 0
    cands = np.stack([t.points for t in trajectories]) if num else np.zeros((0, length, 2))
    scores = np.array([t.score for t in trajectories], dtype=np.float64)
    dt = dts.pop() if dts else float("nan")
    return CandidateSetArrays(
        cands,
        scores,
        int(msg.selected_index),
        dt,
        time_to_ns(msg.header.stamp),
        str(msg.header.frame_id),
        int(msg.denoising_steps),
    )


def path_poses(points, dt, stamp_ns, start_xy, start_yaw) -> tuple[np.ndarray, list[int], np.ndarray]:
    """(points [T, 2], pose stamps in ns, yaws) of the nav_msgs/Path of a trajectory, validated."""
    kind = "Path"
    pts = as_array(kind, "poses", points, (None, 2), np.float64)
    dt = check_dt(kind, dt)
    ns_to_time(stamp_ns)  # a negative stamp is refused before anything is built
    stamps = [int(stamp_ns) + round((k + 1) * dt * NS_PER_S) for k in range(len(pts))]
    return pts, stamps, headings_from_points(pts, start_xy=start_xy, start_yaw=start_yaw)


def trajectory_to_path(
    points: np.ndarray,
    dt: float,
    stamp_ns: int = 0,
    frame_id: str = EGO_FRAME,
    start_xy: Sequence[float] | None = (0.0, 0.0),
    start_yaw: float = 0.0,
) -> Path:
    """nav_msgs/Path of a trajectory (for RViz and standard consumers): pose k stamped
    stamp + (k+1)*dt, orientation from finite differences (see headings_from_points)."""
    pts, stamps, yaws = path_poses(points, dt, stamp_ns, start_xy, start_yaw)
    msg = Path()
    msg.header = make_header(stamp_ns, frame_id)
    for (x, y), stamp, yaw in zip(pts, stamps, yaws):
        pose = PoseStamped()
        pose.header = make_header(stamp, frame_id)
        pose.pose.position.x = float(x)
        pose.pose.position.y = float(y)
        qx, qy, qz, qw = yaw_to_quaternion(float(yaw))
        pose.pose.orientation.x, pose.pose.orientation.y = qx, qy
        pose.pose.orientation.z, pose.pose.orientation.w = qz, qw
        msg.poses.append(pose)
    return msg


def path_to_trajectory(msg: Path) -> TrajectoryArrays:
    """Points and yaw of a Path; dt from the pose stamps (which must be evenly spaced after the header
    stamp, as trajectory_to_path writes them)."""
    kind = "Path"
    num = len(msg.poses)
    pts = np.array([(p.pose.position.x, p.pose.position.y) for p in msg.poses], dtype=np.float64).reshape(
        -1, 2
    )
    check_finite(kind, "poses", pts)
    yaw = np.array(
        [
            orientation_to_yaw(kind, f"poses[{k}].pose.orientation", p.pose.orientation)
            for k, p in enumerate(msg.poses)
        ],
        dtype=np.float32,
    )
    stamp_ns = time_to_ns(msg.header.stamp)
    dt = float("nan")
    if num:
        stamps = np.array([time_to_ns(p.header.stamp) for p in msg.poses], dtype=np.int64)
        offsets = stamps - stamp_ns
        dt_ns = offsets[0]
        expected = np.round(np.arange(1, num + 1) * (dt_ns / NS_PER_S) * NS_PER_S)
        if dt_ns <= 0 or np.max(np.abs(offsets - expected)) > 1000:
            raise fail(
                kind,
                "poses[].header.stamp",
                f"offsets {offsets[:4].tolist()}... ns from header.stamp are not (k+1)*dt with dt > 0",
            )
        dt = dt_ns / NS_PER_S
    return TrajectoryArrays(pts, dt, stamp_ns, str(msg.header.frame_id), yaw, None)
