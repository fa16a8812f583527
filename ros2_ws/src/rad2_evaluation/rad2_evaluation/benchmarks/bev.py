"""Per-frame timing of BEV rasterisation and tokenisation (rad2 bench bev is the CLI). No ROS."""

from __future__ import annotations

import time

import numpy as np


def time_bev_pipeline(clips: list, params: dict, stride: int = 1, progress: bool = True) -> dict:
    """Seconds per frame of snapshot, rasterize_bev, tokens and build_observation for every
    ``stride``-th step of every clip, after one warm-up frame per clip (map preparation, reported as
    ``prep_ms`` per clip). ``params``: params/bev.yaml and vehicle.yaml as loaded, merged."""
    from rad2_core.bev import rasterize_bev, snapshot_from_clip
    from rad2_core.observation import build_observation
    from rad2_core.tokens import agent_tokens, map_tokens, route_tokens
    from tqdm import tqdm

    stages = ("snapshot", "rasterize_bev", "tokens", "build_observation")
    times: dict[str, list[float]] = {k: [] for k in stages}
    frames = [(c, t) for c in clips for t in range(0, c.num_steps, stride)]
    t0 = time.perf_counter()
    for c in clips:
        rasterize_bev(snapshot_from_clip(c, 0, params, params), params=params)
    prep_ms = (time.perf_counter() - t0) * 1e3 / max(len(clips), 1)
    for c, t in tqdm(frames, desc="frames", unit="frame", disable=not progress):
        a = time.perf_counter()
        snap = snapshot_from_clip(c, t, params, params)
        b = time.perf_counter()
        rasterize_bev(snap, params=params)
        d = time.perf_counter()
        map_tokens(snap.map, snap.ego_pose, snap.route_lane_ids, snap.route_polyline, params=params)
        agent_tokens(snap.agents, snap.ego_pose, params)
        route_tokens(snap.route_polyline, snap.ego_pose, params)
        e = time.perf_counter()
        build_observation(snap, params=params)
        f = time.perf_counter()
        for key, dt in zip(times, (b - a, d - b, e - d, f - e)):
            times[key].append(dt)
    return {"clips": len(clips), "frames": len(frames), "prep_ms": prep_ms, "times_s": times}


def print_bev_timings(result: dict, params: dict) -> None:
    from rad2_core.bev import get_config

    cfg = get_config(params)
    print(
        f"clips: {result['clips']}  frames: {result['frames']}  grid: {cfg.shape}  res {cfg.resolution} m  "
        f"supersample {cfg.supersample}"
    )
    print(f"first frame per map (incl. map preparation): {result['prep_ms']:.2f} ms")
    for name, ts in result["times_s"].items():
        ms = np.asarray(ts) * 1e3
        print(
            f"{name:>18}: median {np.median(ms):6.2f} ms   p99 {np.percentile(ms, 99):6.2f} ms   "
            f"max {ms.max():6.2f} ms"
        )
