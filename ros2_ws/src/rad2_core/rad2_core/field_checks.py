"""The error and the field checks that :class:`~rad2_core.lane_map.LaneMap` and :class:`~rad2_core.clip.Clip`
validation share.

Both data classes refuse inconsistent content with :class:`ClipValidationError`, whose message starts
with the offending field's name, so an adapter or a loader can say which field of which clip is wrong.
The checks live here, below both classes, because a clip validates its map and both use the same
shape, finiteness and polyline checks.
"""

from __future__ import annotations

import re

import numpy as np

# ids that become file names (clips/<clip_id>.npz, maps/<map_id>.npz)
SAFE_ID = re.compile(r"^[A-Za-z0-9_.\-]+$")


class ClipValidationError(ValueError):
    """A clip or map is inconsistent; the message starts with the offending field's name."""


def _shape_str(shape) -> str:
    return "(" + ", ".join(str(int(s)) for s in shape) + (",)" if len(shape) == 1 else ")")


def check_array(name: str, value, shape: tuple, dims: str, finite_mask=None, finite=True) -> np.ndarray:
    """``value`` itself once it is an array of ``shape`` (``dims`` names the axes in the message) whose
    floats are finite (only where ``finite_mask`` is True; none checked when ``finite`` is False)."""
    if not isinstance(value, np.ndarray):
        raise ClipValidationError(f"{name}: expected a numpy array, got {type(value).__name__}")
    if tuple(value.shape) != tuple(shape):
        raise ClipValidationError(f"{name}: shape {_shape_str(value.shape)} does not match ({dims})")
    if finite and value.dtype.kind == "f":
        vals = value if finite_mask is None else value[finite_mask]
        if not np.all(np.isfinite(vals)):
            bad = np.argwhere(~np.isfinite(value) & (True if finite_mask is None else finite_mask))[0]
            raise ClipValidationError(f"{name}: non-finite value {value[tuple(bad)]} at index {tuple(bad)}")
    return value


def check_polylines(name: str, polys, min_points: int, count: int | None = None) -> None:
    """Each of ``polys`` a finite [K >= min_points, 2] array, and ``count`` of them when given."""
    if not isinstance(polys, list | tuple):
        raise ClipValidationError(f"{name}: expected a list of [K, 2] arrays, got {type(polys).__name__}")
    if count is not None and len(polys) != count:
        raise ClipValidationError(f"{name}: has {len(polys)} entries, expected {count} (one per lane)")
    for i, p in enumerate(polys):
        if not isinstance(p, np.ndarray) or p.ndim != 2 or p.shape[1] != 2:
            shape = getattr(p, "shape", None)
            raise ClipValidationError(f"{name}[{i}]: expected a [K, 2] array, got shape {shape}")
        if p.shape[0] < min_points:
            raise ClipValidationError(f"{name}[{i}]: has {p.shape[0]} points, needs at least {min_points}")
        if not np.all(np.isfinite(p)):
            raise ClipValidationError(f"{name}[{i}]: contains non-finite coordinates")

