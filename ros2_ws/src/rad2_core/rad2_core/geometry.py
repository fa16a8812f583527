"""Planar rigid-body (SE(2)) helpers shared by the rasteriser, the simulator and the controller.

Poses are (x, y, yaw) with yaw in radians CCW from +x. All functions broadcast over leading axes.
"""

from __future__ import annotations

import math

import numpy as np


def wrap_angle(angle):
    """Wrap angles to (-pi, pi]."""
    a = np.asarray(angle)
    return np.pi - np.mod(np.pi - a, 2.0 * np.pi)


def se2_matrix(pose) -> np.ndarray:
    """(..., 3) pose -> (..., 3, 3) homogeneous transform from the pose's frame to its parent."""
    pose = np.asarray(pose, dtype=np.float64)
    c, s = np.cos(pose[..., 2]), np.sin(pose[..., 2])
    m = np.zeros(pose.shape[:-1] + (3, 3))
    m[..., 0, 0], m[..., 0, 1], m[..., 0, 2] = c, -s, pose[..., 0]
    m[..., 1, 0], m[..., 1, 1], m[..., 1, 2] = s, c, pose[..., 1]
    m[..., 2, 2] = 1.0
    return m


def se2_compose(a, b) -> np.ndarray:
    """a ∘ b: pose b expressed in frame a, mapped to a's parent frame."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    c, s = np.cos(a[..., 2]), np.sin(a[..., 2])
    x = a[..., 0] + c * b[..., 0] - s * b[..., 1]
    y = a[..., 1] + s * b[..., 0] + c * b[..., 1]
    return np.stack([x, y, wrap_angle(a[..., 2] + b[..., 2])], axis=-1)


def se2_inverse(a) -> np.ndarray:
    a = np.asarray(a, dtype=np.float64)
    c, s = np.cos(a[..., 2]), np.sin(a[..., 2])
    x = -(c * a[..., 0] + s * a[..., 1])
    y = s * a[..., 0] - c * a[..., 1]
    return np.stack([x, y, wrap_angle(-a[..., 2])], axis=-1)


def relative_pose(reference, target) -> np.ndarray:
    """Pose of ``target`` in the frame of ``reference`` (reference⁻¹ ∘ target)."""
    return se2_compose(se2_inverse(reference), target)


def world_to_ego(points, ego_pose) -> np.ndarray:
    """(..., N, 2) world points -> ego frame of ``ego_pose`` (3,) or (..., 3)."""
    points = np.asarray(points, dtype=np.float64)
    ego_pose = np.asarray(ego_pose, dtype=np.float64)
    c = np.cos(ego_pose[..., 2])[..., None]
    s = np.sin(ego_pose[..., 2])[..., None]
    dx = points[..., 0] - ego_pose[..., 0][..., None]
    dy = points[..., 1] - ego_pose[..., 1][..., None]
    return np.stack([c * dx + s * dy, -s * dx + c * dy], axis=-1)


def ego_to_world(points, ego_pose) -> np.ndarray:
    """(..., N, 2) ego-frame points -> world frame."""
    points = np.asarray(points, dtype=np.float64)
    ego_pose = np.asarray(ego_pose, dtype=np.float64)
    c = np.cos(ego_pose[..., 2])[..., None]
    s = np.sin(ego_pose[..., 2])[..., None]
    x = ego_pose[..., 0][..., None] + c * points[..., 0] - s * points[..., 1]
    y = ego_pose[..., 1][..., None] + s * points[..., 0] + c * points[..., 1]
    return np.stack([x, y], axis=-1)


def rotate_vectors(vectors, angle) -> np.ndarray:
    """Rotate (..., 2) vectors by ``angle`` (broadcast over leading axes)."""
    vectors = np.asarray(vectors, dtype=np.float64)
    c, s = np.cos(angle), np.sin(angle)
    return np.stack(
        [c * vectors[..., 0] - s * vectors[..., 1], s * vectors[..., 0] + c * vectors[..., 1]], axis=-1
    )


def box_corners(x, y, yaw, length, width) -> np.ndarray:
    """Corners (..., 4, 2) of oriented boxes (centre, heading, full length and width), CCW."""
    x, y, yaw, length, width = np.broadcast_arrays(
        *(np.asarray(v, dtype=np.float64) for v in (x, y, yaw, length, width))
    )
    c, s = np.cos(yaw), np.sin(yaw)
    hl, hw = length / 2.0, width / 2.0
    local = np.array([[1, 1], [-1, 1], [-1, -1], [1, -1]], dtype=np.float64)
    lx = local[:, 0] * hl[..., None]
    ly = local[:, 1] * hw[..., None]
    cx = x[..., None] + c[..., None] * lx - s[..., None] * ly
    cy = y[..., None] + s[..., None] * lx + c[..., None] * ly
    return np.stack([cx, cy], axis=-1)


def boxes_overlap(a, b) -> np.ndarray:
    """Separating-axis overlap of oriented rectangles ``a [..., 5]`` and ``b [..., 5]`` (x, y, yaw,
    full length, full width), broadcast against each other -> bool; touching boxes overlap.

    The one box-overlap test of the project (planner selection, open-loop metrics, simulator safety
    checks, validators). It works on box parameters, not corners: with Δ the heading difference and
    ``d`` the centre offset, the projections of both boxes on each of the four axes reduce to
    ``|cos Δ|`` and ``|sin Δ|`` terms (~30 flops a pair), and they are evaluated only for the pairs
    whose bounding circles meet.
    """
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    for name, boxes in (("a", a), ("b", b)):
        if boxes.ndim == 0 or boxes.shape[-1] != 5:
            raise ValueError(
                f"{name}: expected boxes of shape [..., 5] (x, y, yaw, length, width), got {boxes.shape}"
            )
    al, aw = 0.5 * a[..., 3], 0.5 * a[..., 4]
    bl, bw = 0.5 * b[..., 3], 0.5 * b[..., 4]
    dx = b[..., 0] - a[..., 0]
    dy = b[..., 1] - a[..., 1]
    # Bounding circles first: most pairs of a planning scene are far apart, and only the near ones
    # need the four axes. Written as "not beyond reach" so that a NaN pair counts as overlapping, as
    # it does on the axes (a safety check must not clear an undefined box).
    reach = np.hypot(al, aw) + np.hypot(bl, bw)
    near = np.asarray(~(dx * dx + dy * dy > reach * reach))
    if not near.any():
        return near
    shape = near.shape

    def pick(v):
        return np.broadcast_to(v, shape)[near]

    ca, sa, al, aw = (pick(v) for v in (np.cos(a[..., 2]), np.sin(a[..., 2]), al, aw))
    cb, sb, bl, bw = (pick(v) for v in (np.cos(b[..., 2]), np.sin(b[..., 2]), bl, bw))
    dx, dy = dx[near], dy[near]
    cos_d = np.abs(ca * cb + sa * sb)
    sin_d = np.abs(sa * cb - ca * sb)
    separated = np.abs(dx * ca + dy * sa) > al + bl * cos_d + bw * sin_d  # a's long axis
    separated |= np.abs(dy * ca - dx * sa) > aw + bl * sin_d + bw * cos_d  # a's lateral axis
    separated |= np.abs(dx * cb + dy * sb) > bl + al * cos_d + aw * sin_d  # b's long axis
    separated |= np.abs(dy * cb - dx * sb) > bw + al * sin_d + aw * cos_d  # b's lateral axis
    near[near] = ~separated
    return near


def tracks_overlap(a, b, b_valid=None) -> np.ndarray:
    """For box tracks ``a [M, T, 5]`` and ``b [N, T, 5]`` at the same T times: ``[M, T]`` bool, whether
    box ``a[m, t]`` overlaps any box ``b[n, t]`` (with ``b_valid [N, T]``: any valid one). Equal to
    ``(boxes_overlap(a[:, None], b[None]) & b_valid[None]).any(axis=1)``.

    Why not that one-liner: with M = 32 candidates, 50 agents and 8 times it evaluates 12,800 pairs,
    of which a planning scene has a few dozen near ones. Here a broad phase first keeps the (agent,
    time) pairs whose bounding circle reaches the box that bounds all of ``a``'s boxes at that time
    (N x T tests), and the exact test runs on those alone. Undefined (NaN) boxes are kept by the broad
    phase and overlap in the exact test, as in :func:`boxes_overlap`.
    """
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.ndim != 3 or a.shape[-1] != 5 or b.ndim != 3 or b.shape[-1] != 5 or a.shape[1] != b.shape[1]:
        raise ValueError(f"tracks_overlap: expected a [M, T, 5] and b [N, T, 5] with the same T, "
                         f"got {a.shape} and {b.shape}")
    m, t = a.shape[:2]
    hit = np.zeros((m, t), dtype=bool)
    if m == 0 or b.shape[0] == 0:
        return hit
    # box bounding all of a's circles at each time [T, 2]; a NaN propagates into it
    reach_a = 0.5 * np.hypot(a[..., 3], a[..., 4])[..., None]
    lo = (a[..., :2] - reach_a).min(axis=0)
    hi = (a[..., :2] + reach_a).max(axis=0)
    # distance (per axis) of b's centres outside that box, against b's circle; np.maximum and max
    # propagate NaN and a NaN comparison is False, so an undefined box on either side stays near
    outside = np.maximum(lo - b[..., :2], b[..., :2] - hi).max(axis=-1)  # N T
    near = ~(outside > 0.5 * np.hypot(b[..., 3], b[..., 4]))
    if b_valid is not None:
        near &= np.asarray(b_valid, dtype=bool)
    ti, ni = np.nonzero(near.T)  # time-major: pairs of one time are contiguous
    if not len(ti):
        return hit
    pair = boxes_overlap(a[:, ti], b[ni, ti][None])  # M K
    times, starts = np.unique(ti, return_index=True)
    hit[:, times] = np.logical_or.reduceat(pair, starts, axis=1)
    return hit


def yaw_to_quaternion(yaw: float) -> tuple[float, float, float, float]:
    """Planar rotation about +z as a quaternion (x, y, z, w)."""
    return 0.0, 0.0, math.sin(yaw / 2.0), math.cos(yaw / 2.0)


def quaternion_to_yaw(x: float, y: float, z: float, w: float) -> float:
    """Yaw (rotation about +z) of a unit quaternion; roll and pitch are ignored (planar world)."""
    return math.atan2(2.0 * (w * z + x * y), 1.0 - 2.0 * (y * y + z * z))
