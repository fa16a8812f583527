"""Pictures of clips: a world-frame scene view (map, agents, ego, route) next to the BEV channels."""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

import numpy as np

from rad2_core.bev import get_config, rasterize_bev, snapshot_from_clip
from rad2_core.clip import AGENT_CYCLIST, AGENT_PEDESTRIAN, AGENT_VEHICLE, Clip
from rad2_core.geometry import box_corners

_TYPE_COLOURS = {AGENT_VEHICLE: "tab:blue", AGENT_PEDESTRIAN: "tab:orange", AGENT_CYCLIST: "tab:green"}


def _figure(clip: Clip, t: int, params: dict[str, Any], vehicle_params: dict[str, Any], view_radius: float,
            show_bev: bool):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Polygon

    cfg = get_config(params)
    snap = snapshot_from_clip(clip, t, params, vehicle_params)
    channels = list(cfg.channels) if show_bev else []
    ncols = 1 + (int(np.ceil(len(channels) / 2)) if channels else 0)
    fig = plt.figure(figsize=(5 + 2.2 * (ncols - 1), 5), dpi=90)
    grid = fig.add_gridspec(2, max(ncols, 1) + 1, width_ratios=[2.2] + [1] * max(ncols, 1))
    ax = fig.add_subplot(grid[:, 0])
    m = clip.map
    for poly in m.drivable_areas:
        ax.add_patch(Polygon(poly, closed=True, facecolor="0.92", edgecolor="none", zorder=0))
    for poly in m.crosswalks:
        ax.add_patch(Polygon(poly, closed=True, facecolor="khaki", edgecolor="none", alpha=0.6, zorder=1))
    for lb, rb in zip(m.left_boundaries, m.right_boundaries):
        ax.plot(lb[:, 0], lb[:, 1], color="0.6", lw=0.6, zorder=2)
        ax.plot(rb[:, 0], rb[:, 1], color="0.6", lw=0.6, zorder=2)
    for cl in m.centerlines:
        ax.plot(cl[:, 0], cl[:, 1], color="0.8", lw=0.5, ls="--", zorder=2)
    rp = clip.route_polyline
    ax.plot(rp[:, 0], rp[:, 1], color="tab:purple", lw=2.0, alpha=0.5, zorder=3, label="route")
    ax.plot(clip.ego_x, clip.ego_y, color="tab:red", lw=0.8, alpha=0.6, zorder=3)
    now = clip.agents_at(t)
    for k in range(len(now)):
        corners = box_corners(now.x[k], now.y[k], now.yaw[k], now.length[k], now.width[k])
        colour = _TYPE_COLOURS.get(int(now.types[k]), "tab:gray")
        ax.add_patch(Polygon(corners, closed=True, facecolor=colour, edgecolor="k", lw=0.4, zorder=4))
        ax.arrow(now.x[k], now.y[k], 0.5 * now.vx[k], 0.5 * now.vy[k], width=0.05, color="k", zorder=5)
    pose = clip.ego_pose(t)
    ego = box_corners(pose[0], pose[1], pose[2], clip.ego_length, clip.ego_width)
    ax.add_patch(Polygon(ego, closed=True, facecolor="tab:red", edgecolor="k", lw=0.6, zorder=6))
    ax.set_xlim(pose[0] - view_radius, pose[0] + view_radius)
    ax.set_ylim(pose[1] - view_radius, pose[1] + view_radius)
    ax.set_aspect("equal")
    ax.set_title(f"{clip.clip_id}  t={t * clip.dt:.1f}s  v={clip.ego_speed[t]:.1f} m/s", fontsize=8)
    ax.tick_params(labelsize=6)
    if channels:
        bev = rasterize_bev(snap, params=params)
        extent = (
            cfg.origin_x,
            cfg.origin_x + cfg.width * cfg.resolution,
            cfg.origin_y,
            cfg.origin_y + cfg.height * cfg.resolution,
        )
        for idx, name in enumerate(channels):
            sub = fig.add_subplot(grid[idx % 2, 1 + idx // 2])
            img = bev[idx]
            if name.startswith("agent_velocity"):
                lim = max(1.0, float(np.abs(img).max()))
                sub.imshow(img, origin="lower", extent=extent, cmap="coolwarm", vmin=-lim, vmax=lim)
            else:
                sub.imshow(
                    img,
                    origin="lower",
                    extent=extent,
                    cmap="viridis",
                    vmin=0,
                    vmax=max(1.0, float(img.max())),
                )
            sub.set_title(name, fontsize=7)
            sub.set_xticks([])
            sub.set_yticks([])
    fig.tight_layout()
    return fig


def render_frame(
    clip: Clip, t: int, params: dict[str, Any], vehicle_params: dict[str, Any], view_radius: float = 40.0,
    show_bev: bool = True,
) -> np.ndarray:
    """RGB uint8 image [H, W, 3] of step ``t`` (``params``: params/bev.yaml, ``vehicle_params``:
    params/vehicle.yaml, as loaded)."""
    import matplotlib.pyplot as plt

    fig = _figure(clip, t, params, vehicle_params, view_radius, show_bev)
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    buf.seek(0)
    import imageio.v3 as iio

    return np.asarray(iio.imread(buf))[..., :3]


def save_frame_png(clip: Clip, t: int, path: str | os.PathLike, **kwargs) -> Path:
    import imageio.v3 as iio

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    iio.imwrite(path, render_frame(clip, t, **kwargs))
    return path


def save_clip_gif(
    clip: Clip, path: str | os.PathLike, stride: int = 2, progress: bool = True, **kwargs
) -> Path:
    """Animated GIF of the clip, every ``stride``-th step, played at real time."""
    import imageio.v2 as imageio
    from tqdm import tqdm

    if stride < 1:
        raise ValueError(f"stride: {stride} must be >= 1")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    steps = range(0, clip.num_steps, stride)
    frames = [
        render_frame(clip, t, **kwargs)
        for t in tqdm(steps, desc=f"render {clip.clip_id}", disable=not progress, unit="frame")
    ]
    imageio.mimsave(path, frames, duration=clip.dt * stride, loop=0)
    return path
