"""What every converter of :mod:`rad2_ros.conversions` shares: the validation error, the checks that
name the offending field, float32 rounding and buffers, stamps and headers, headings of a polyline.

A decoder raises :class:`MessageValidationError` through :func:`fail`, whose message is
``<MessageType>.<field> <detail>``, so a node can say which field of which message it rejected.
"""

from __future__ import annotations

import array
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from builtin_interfaces.msg import Time
from rad2_core.geometry import quaternion_to_yaw
from std_msgs.msg import Header

EGO_FRAME = "base_link"
WORLD_FRAME = "map"
NS_PER_S = 1_000_000_000
# Points closer than this give no usable direction; the previous heading is kept.
_MIN_HEADING_STEP_M = 1e-3


class MessageValidationError(ValueError):
    """A message (or the arrays to encode into one) violates the rad2 interface contract."""


def fail(message_type: str, field_name: str, detail: str) -> MessageValidationError:
    """The error to raise: ``<message_type>.<field_name> <detail>``."""
    return MessageValidationError(f"{message_type}.{field_name} {detail}")


def check_finite(message_type: str, field_name: str, values: np.ndarray) -> None:
    """Refuse non-finite ``values``, naming how many and the first one with its index."""
    values = np.asarray(values)
    if values.size and not np.all(np.isfinite(values)):
        bad = np.argwhere(~np.isfinite(values))
        first = tuple(int(i) for i in bad[0])
        raise fail(
            message_type,
            field_name,
            f"has {len(bad)} non-finite values (first {values[first]!r} at index {first})",
        )


def check_rows_finite(message_type: str, field_pattern: str, values: np.ndarray) -> None:
    """Like ``check_finite`` for values stacked from many sub-messages (axis 0): the error names the
    first bad one (``field_pattern`` formatted with its index) and the index within it."""
    finite = np.isfinite(values)
    if finite.all():
        return
    row = int(np.argwhere(~finite.reshape(len(values), -1).all(axis=1))[0, 0])
    if values.ndim == 1:
        check_scalar(message_type, field_pattern.format(row), values[row])
    check_finite(message_type, field_pattern.format(row), values[row])


# A heading or other angle in radians is read within one turn either way of zero: every source rad2
# knows wraps it (atan2, a quaternion) or unwraps it over a clip at most. A finite value far beyond
# (1e9 rad) is no angle at all: float32 has no fraction of a turn left at that magnitude, and its
# cos/sin would be noise. The 1e-3 absorbs float32 rounding of values at +-2 pi.
MAX_ABS_ANGLE_RAD = 2.0 * math.pi + 1e-3


def check_angles(message_type: str, field_name: str, values: np.ndarray) -> None:
    """Refuse non-finite angles and finite ones outside [-2 pi, 2 pi] (``MAX_ABS_ANGLE_RAD``), naming
    the first one out with its index. A ``field_name`` with ``{}`` names values stacked from many
    sub-messages (axis 0) by the sub-message's index, as ``check_rows_finite`` does."""
    values = np.asarray(values, dtype=np.float64)
    out = ~(np.abs(values) <= MAX_ABS_ANGLE_RAD)  # NaN is out too
    if not out.any():
        return
    first = tuple(int(i) for i in np.argwhere(out)[0])
    name, index = field_name, first
    if "{}" in field_name:
        name, index = field_name.format(first[0]), first[1:]
    where = f" at index {index}" if index else ""
    raise fail(message_type, name, f"is {values[first]!r} rad{where}, expected a finite angle within "
                                   f"[-2 pi, 2 pi]")


def check_scalar(message_type: str, field_name: str, value: float) -> float:
    """``value`` as a float, refused when it is not finite."""
    value = float(value)
    if not math.isfinite(value):
        raise fail(message_type, field_name, f"is {value!r}, expected a finite number")
    return value


def as_array(message_type: str, field_name: str, value: Any, shape: tuple, dtype=np.float32) -> np.ndarray:
    """`value` as an array of `shape` (None = any size on that axis), finite if floating."""
    try:
        arr = np.asarray(value, dtype=dtype)
    except (TypeError, ValueError) as err:
        raise fail(message_type, field_name, f"cannot be read as {np.dtype(dtype).name}: {err}") from err
    if arr.ndim != len(shape) or any(want is not None and got != want for got, want in zip(arr.shape, shape)):
        expected = "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"
        raise fail(message_type, field_name, f"has shape {list(arr.shape)}, expected {expected}")
    if np.issubdtype(arr.dtype, np.floating):
        check_finite(message_type, field_name, arr)
    return arr


def f32(value: float) -> float:
    """A value for a float32 field, rounded now so that an unserialized message (intra-process
    delivery, composed nodes) decodes to exactly what one that crossed DDS does."""
    return float(np.float32(value))


def float32_array(values: np.ndarray) -> array.array:
    """A float32[] message field from an array in one buffer copy (a Python list costs ~30x more)."""
    out = array.array("f")
    out.frombytes(np.ascontiguousarray(values, dtype=np.float32).tobytes())
    return out


def ns_to_time(stamp_ns: int) -> Time:
    """Integer nanoseconds -> ``builtin_interfaces/Time`` (a negative stamp is refused)."""
    stamp_ns = int(stamp_ns)
    if stamp_ns < 0:
        raise MessageValidationError(f"builtin_interfaces/Time: stamp_ns {stamp_ns} is negative")
    return Time(sec=stamp_ns // NS_PER_S, nanosec=stamp_ns % NS_PER_S)


def make_header(stamp_ns: int, frame_id: str) -> Header:
    """A ``std_msgs/Header`` from a nanosecond stamp."""
    return Header(stamp=ns_to_time(stamp_ns), frame_id=str(frame_id))


def headings_from_points(
    points: np.ndarray, start_xy: Sequence[float] | None = (0.0, 0.0), start_yaw: float = 0.0
) -> np.ndarray:
    """Heading (rad) at each of `points` [T, 2] by central finite differences.

    `start_xy` is the position before the first point (the ego origin for an ego-frame plan; None
    when unknown: forward difference at the first point). Where consecutive points nearly coincide
    (a stop) the previous heading is held, starting from `start_yaw`.
    """
    pts = np.asarray(points, dtype=np.float64).reshape(-1, 2)
    if len(pts) == 0:
        return np.zeros(0)
    padded = pts if start_xy is None else np.vstack([np.asarray(start_xy, dtype=np.float64)[None], pts])
    offset = 0 if start_xy is None else 1
    headings = np.empty(len(pts))
    previous = float(start_yaw)
    for k in range(len(pts)):
        i = k + offset
        before = padded[max(i - 1, 0)]
        after = padded[min(i + 1, len(padded) - 1)]
        delta = after - before
        if math.hypot(delta[0], delta[1]) >= _MIN_HEADING_STEP_M:
            previous = math.atan2(delta[1], delta[0])
        headings[k] = previous
    return headings


def orientation_to_yaw(kind: str, field_name: str, q: Any) -> float:
    """Yaw of a received quaternion, refused when it is not finite or not of unit norm (within 1e-3)."""
    values = np.array([q.x, q.y, q.z, q.w], dtype=np.float64)
    check_finite(kind, field_name, values)
    norm = float(np.linalg.norm(values))
    if abs(norm - 1.0) > 1e-3:
        raise fail(kind, field_name, f"has norm {norm:.6f}, expected a unit quaternion")
    return quaternion_to_yaw(*(float(v) for v in values / norm))
