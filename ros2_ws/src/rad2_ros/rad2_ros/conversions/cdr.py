"""CDR bytes written straight from the arrays for the planner's per-cycle outputs (``CandidateSet``,
``planning/markers``, ``planning/path``); ``Publisher.publish`` takes the bytes.

Building the message objects first costs most of the publish time: M x T ``geometry_msgs/Point``
objects at ~10 us each (2.8 ms for the candidate set at M = 32 when first written). A library
serializer was measured against these writers: ``rosbags``' ``serialize_cdr`` with the typestore of
:mod:`rad2_datasets.bags`, its message dataclasses built from the same arrays (its bytes equal these
for the candidate set and the path). One-off timeit, best of 7, on a shared 2-core machine:

=========================  ===========  =========  ===============================
message                    this module  rosbags    rclpy message objects + serialize
CandidateSet M=32, T=8     0.035 ms     0.39 ms    0.83 ms
CandidateSet M=128, T=8    0.087 ms     1.53 ms
MarkerArray M=32, T=8      0.33 ms      0.87 ms    1.35 ms
Path T=8                   0.051 ms     0.060 ms   0.12 ms
=========================  ===========  =========  ===============================

The library spends its time building one dataclass per point, so it is 11-18x slower on the candidate
set (published every cycle while someone subscribes) and 2.6x on the markers, the p99 of the
planner's publish stage. Path alone would be as fast with it, but the writer stays for the other two,
and the typestore costs ~70 ms on first use (building it, generating the serializer), which would land
in the planner's first cycle. Each writer's bytes are tested to decode, with rclpy, to the message the
matching ``*_to_msg`` builds (tests/ros/test_ros_conversions.py).
"""

from __future__ import annotations

import struct

import numpy as np
from rad2_core.geometry import yaw_to_quaternion
from visualization_msgs.msg import Marker, MarkerArray

from rad2_ros.conversions.common import EGO_FRAME, ns_to_time
from rad2_ros.conversions.markers import MARKER_Z, candidate_markers_to_msg, marker_fields
from rad2_ros.conversions.trajectory import candidate_set_fields, check_dt, path_poses


class _CdrWriter:
    """Little-endian plain CDR (the encapsulation ROS 2's rmw uses), alignment relative to the data
    after the 4-byte encapsulation header, as Fast CDR writes it."""

    def __init__(self) -> None:
        self.buf = bytearray(b"\x00\x01\x00\x00")

    def _align(self, size: int) -> None:
        self.buf += b"\x00" * (-(len(self.buf) - 4) % size)

    def pack(self, fmt: str, *values) -> None:
        """Primitives of one size (``fmt`` a struct code repeated, e.g. "II"), aligned to it."""
        self._align(struct.calcsize("<" + fmt[0]))
        self.buf += struct.pack("<" + fmt, *values)

    def string(self, text: str) -> None:
        data = text.encode("utf-8") + b"\x00"
        self.pack("I", len(data))
        self.buf += data

    def header(self, stamp_ns: int, frame_id: str) -> None:
        stamp = ns_to_time(stamp_ns)
        self.pack("iI", stamp.sec, stamp.nanosec)
        self.string(frame_id)

    def array(self, values: np.ndarray, dtype: str) -> None:
        """The elements of a primitive array (the sequence length written by the caller)."""
        data = np.ascontiguousarray(values, dtype=dtype)
        if data.size:
            self._align(data.itemsize)
            self.buf += data.tobytes()


def _trajectory_record_prefix(start: int, stamp_ns: int, frame_id: str, dt32: float, length: int) -> bytes:
    """A candidate ``Trajectory``'s bytes up to its points, for a record that begins ``start`` bytes
    (mod 8) after the encapsulation header: header, dt, the points' count and the padding that aligns
    the float64 points."""
    w = _CdrWriter()
    w.buf += b"\x00" * start
    w.header(stamp_ns, frame_id)
    w.pack("f", dt32)
    w.pack("I", length)
    if length:  # an empty array is not aligned (Fast CDR aligns only what it writes)
        w._align(8)
    return bytes(w.buf[4 + start:])


def candidate_set_to_cdr(
    candidates: np.ndarray,
    scores: np.ndarray,
    selected: int,
    dt: float,
    stamp_ns: int = 0,
    frame_id: str = EGO_FRAME,
    denoising_steps: int = 0,
) -> bytes:
    """The serialized ``CandidateSet`` that ``candidate_set_to_msg`` builds, byte for byte, written
    straight from the arrays: building M x T ``geometry_msgs/Point`` objects costs ~10 us each in
    Python (2.8 ms at M = 32). ``Publisher.publish`` takes the bytes.

    The M candidate records differ only in their points and score; the rest of a record depends on
    where it starts modulo 8 (the float64 points are 8-aligned, everything else 4-aligned), so it is
    written once per alignment and the records are joined (~0.03 ms at M = 32, ~0.2 ms field by field).
    """
    cands, score_arr, selected = candidate_set_fields(candidates, scores, selected, denoising_steps)
    dt32 = check_dt("CandidateSet", dt)
    num, length = cands.shape[0], cands.shape[1]
    out = _CdrWriter()
    out.header(stamp_ns, frame_id)
    out.pack("I", num)
    xyz = np.zeros((num, length, 3), dtype="<f8")
    xyz[..., :2] = cands
    points = [row.tobytes() for row in xyz]
    # after the points (8-aligned, 24 bytes each): empty yaw and speed (two zero counts), the score
    tails = [b"\x00" * 8 + struct.pack("<f", score) for score in score_arr.astype(np.float32)]
    prefixes: dict[int, bytes] = {}  # record start mod 8 -> the record's bytes before its points
    parts = [bytes(out.buf)]
    pos = len(out.buf) - 4
    for m in range(num):
        key = pos % 8
        prefix = prefixes.get(key)
        if prefix is None:
            prefix = prefixes[key] = _trajectory_record_prefix(key, stamp_ns, frame_id, dt32, length)
        parts += (prefix, points[m], tails[m])
        pos += len(prefix) + len(points[m]) + len(tails[m])
    parts.append(struct.pack("<iI", selected, int(denoising_steps)))  # every field is 4-aligned here
    return b"".join(parts)


def _marker_cdr(out: _CdrWriter, stamp_ns: int, frame_id: str, ns: str, marker_id: int, marker_type: int,
                action: int, width: float, rgba: tuple, points: np.ndarray) -> None:
    """One visualization_msgs/Marker (the fields of ROS 2 Kilted's definition, in order) with the pose at
    the identity and every field the candidate lines leave unset at its default."""
    out.header(stamp_ns, frame_id)
    out.string(ns)
    out.pack("iii", marker_id, marker_type, action)
    out.pack("dddddddddd", 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0, width, 0.0, 0.0)  # pose, scale
    out.pack("ffff", *rgba)
    out.pack("iI", 0, 0)  # lifetime
    out.pack("?", False)  # frame_locked
    out.pack("I", len(points))
    out.array(points, "<f8")
    out.buf += _MARKER_TAIL  # 4-aligned here (after the float64 points or their count)


def _marker_tail() -> bytes:
    """The fields after a Marker's points, all at their defaults: the same bytes for every marker
    (every one of them 4-aligned, and they start 4-aligned)."""
    out = _CdrWriter()
    out.pack("I", 0)  # colors
    out.string("")  # texture_resource
    out.header(0, "")  # texture: sensor_msgs/CompressedImage
    out.string("")
    out.pack("I", 0)
    out.pack("I", 0)  # uv_coordinates
    out.string("")  # text
    out.string("")  # mesh_resource
    out.string("")  # mesh_file: visualization_msgs/MeshFile
    out.pack("I", 0)
    out.pack("?", False)  # mesh_use_embedded_materials
    return bytes(out.buf[4:])


_MARKER_TAIL = _marker_tail()


def candidate_markers_to_cdr(candidates: np.ndarray, scores: np.ndarray, selected: int, stamp_ns: int,
                             frame_id: str = EGO_FRAME) -> bytes:
    """The serialized MarkerArray that :func:`candidate_markers_to_msg` builds, written from the arrays
    (about 5x faster at M = 32 than building and serializing the message objects). The layout is that
    of ROS 2 Kilted's Marker; :func:`markers_cdr_matches_this_distro` checks it against the installed
    definition, and the planner node builds messages where it does not match."""
    cands, styles = marker_fields(candidates, scores, selected)
    out = _CdrWriter()
    out.pack("I", len(cands) + 1)
    _marker_cdr(out, stamp_ns, frame_id, "", 0, Marker.ARROW, Marker.DELETEALL, 0.0, (0.0, 0.0, 0.0, 0.0),
                np.zeros((0, 3)))
    xyz = np.full((cands.shape[1] + 1, 3), MARKER_Z, dtype="<f8")
    xyz[0, :2] = 0.0
    for m, (traj, (ns, width, rgba)) in enumerate(zip(cands, styles)):
        xyz[1:, :2] = traj
        _marker_cdr(out, stamp_ns, frame_id, ns, m, Marker.LINE_STRIP, Marker.ADD, width, rgba, xyz)
    return bytes(out.buf)


def markers_cdr_matches_this_distro() -> bool:
    """Whether :func:`candidate_markers_to_cdr` decodes, with this ROS 2 install's Marker definition, to
    the message :func:`candidate_markers_to_msg` builds (a distro whose Marker has other fields does not)."""
    from rclpy.serialization import deserialize_message, serialize_message

    rng = np.random.default_rng(0)
    cands = rng.normal(size=(3, 4, 2))
    scores = np.array([0.25, np.nan, 0.75])
    try:
        got = deserialize_message(candidate_markers_to_cdr(cands, scores, 2, 123, "frame"), MarkerArray)
    except Exception:  # noqa: BLE001 -- a layout the installed definition cannot read
        return False
    # what a subscriber of the message objects receives (colours rounded to float32 on the way)
    sent = deserialize_message(serialize_message(candidate_markers_to_msg(cands, scores, 2, 123, "frame")),
                               MarkerArray)
    return got == sent


def trajectory_to_path_cdr(points: np.ndarray, dt: float, stamp_ns: int = 0,
                           frame_id: str = EGO_FRAME) -> bytes:
    """The serialized ``nav_msgs/Path`` that ``trajectory_to_path`` builds for a plan from the ego (the
    origin, heading 0), written from the arrays (T PoseStamped objects cost ~0.1 ms to build at T = 8;
    the bytes ~0.03 ms)."""
    pts, stamps, yaws = path_poses(points, dt, stamp_ns, (0.0, 0.0), 0.0)
    out = _CdrWriter()
    out.header(stamp_ns, frame_id)
    out.pack("I", len(pts))
    for (x, y), stamp, yaw in zip(pts, stamps, yaws):
        out.header(stamp, frame_id)
        out.pack("ddddddd", float(x), float(y), 0.0, *yaw_to_quaternion(float(yaw)))
    return bytes(out.buf)
