"""BevFeatures <-> a [C, H, W] float32 raster with its grid geometry and channel names.

The raster is assigned through ``array.array`` built from the numpy buffer and read back with
``np.frombuffer``: building a Python list element by element costs ~30x more.
"""

from __future__ import annotations

import array
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from rad2_datasets.bags import time_to_ns
from rad2_msgs.msg import BevFeatures

from rad2_ros.conversions.common import (
    EGO_FRAME,
    as_array,
    check_scalar,
    f32,
    fail,
    float32_array,
    make_header,
)


@dataclass(frozen=True)
class BevGrid:
    """Grid geometry of a BEV raster (BevFeatures.msg convention, ego frame, metres)."""

    resolution: float
    height: int
    width: int
    origin_x: float
    origin_y: float

    def as_float32(self) -> BevGrid:
        """The geometry as a BevFeatures message carries it (float32 resolution and origin)."""
        return BevGrid(
            f32(self.resolution), self.height, self.width, f32(self.origin_x), f32(self.origin_y)
        )

    @classmethod
    def from_params(cls, bev_params: Mapping[str, Any]) -> BevGrid:
        """From the `bev` block of params/bev.yaml (load_params("bev")["bev"])."""
        return cls(
            resolution=float(bev_params["resolution_m"]),
            height=int(bev_params["height"]),
            width=int(bev_params["width"]),
            origin_x=float(bev_params["origin_x"]),
            origin_y=float(bev_params["origin_y"]),
        )


@dataclass
class BevFrame:
    """A decoded BevFeatures message."""

    features: np.ndarray  # [C, H, W] float32
    grid: BevGrid
    channel_names: tuple[str, ...]
    stamp_ns: int
    frame_id: str


def _check_grid(message_type: str, grid: BevGrid) -> None:
    if not (math.isfinite(grid.resolution) and grid.resolution > 0):
        raise fail(message_type, "resolution", f"is {grid.resolution!r}, expected a positive finite number")
    if grid.height <= 0 or grid.width <= 0:
        raise fail(message_type, "height/width", f"are {grid.height}x{grid.width}, expected positive sizes")
    for name in ("origin_x", "origin_y"):
        check_scalar(message_type, name, getattr(grid, name))


def bev_to_msg(
    features: np.ndarray,
    grid: BevGrid,
    channel_names: Sequence[str],
    stamp_ns: int = 0,
    frame_id: str = EGO_FRAME,
) -> BevFeatures:
    """Encode a [C, H, W] raster with its grid geometry and channel names."""
    kind = "BevFeatures"
    _check_grid(kind, grid)
    names = [str(n) for n in channel_names]
    feats = as_array(kind, "data", features, (len(names), grid.height, grid.width))
    msg = BevFeatures()
    msg.header = make_header(stamp_ns, frame_id)
    msg.resolution = f32(grid.resolution)
    msg.height = int(grid.height)
    msg.width = int(grid.width)
    msg.origin_x = f32(grid.origin_x)
    msg.origin_y = f32(grid.origin_y)
    msg.channel_names = names
    msg.data = float32_array(feats)
    return msg


def bev_from_msg(
    msg: BevFeatures, expected_channels: Sequence[str] | None = None, expected_grid: BevGrid | None = None
) -> BevFrame:
    """Decode and validate: data size against the declared grid and channels, finiteness, and (when
    given) the channel names and grid the consumer was configured for."""
    kind = "BevFeatures"
    grid = BevGrid(
        float(msg.resolution), int(msg.height), int(msg.width), float(msg.origin_x), float(msg.origin_y)
    )
    _check_grid(kind, grid)
    names = tuple(str(n) for n in msg.channel_names)
    if not names:
        raise fail(kind, "channel_names", "is empty, expected at least one channel")
    if len(set(names)) != len(names):
        raise fail(kind, "channel_names", f"has duplicates: {list(names)}")
    if expected_channels is not None and tuple(expected_channels) != names:
        raise fail(
            kind,
            "channel_names",
            f"has {len(names)} channels {list(names)}, expected {len(expected_channels)} "
            f"{list(expected_channels)}",
        )
    # The message carries float32 geometry: compare with the configured grid at that precision.
    if expected_grid is not None and grid != expected_grid.as_float32():
        raise fail(kind, "grid", f"is {grid}, expected {expected_grid}")
    num_values = len(msg.data)
    expected = len(names) * grid.height * grid.width
    if num_values != expected:
        raise fail(
            kind,
            "data",
            f"has {num_values} values, expected {len(names)}*{grid.height}*{grid.width}={expected} "
            f"for the declared grid and {len(names)} channel names",
        )
    data = msg.data
    if not isinstance(data, array.array) or data.typecode != "f":
        data = array.array("f", data)
    features = np.frombuffer(data, dtype=np.float32).reshape(len(names), grid.height, grid.width)
    if not np.all(np.isfinite(features)):
        bad = np.argwhere(~np.isfinite(features))
        c, i, j = (int(v) for v in bad[0])
        raise fail(
            kind,
            "data",
            f"has {len(bad)} non-finite values (first {features[c, i, j]!r} in channel '{names[c]}' "
            f"at row {i}, column {j})",
        )
    return BevFrame(features, grid, names, time_to_ns(msg.header.stamp), str(msg.header.frame_id))
