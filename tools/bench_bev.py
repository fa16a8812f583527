#!/usr/bin/env python3
"""Benchmark BEV rasterisation and tokenisation per frame (median / p99 in ms) over clips.

Uses a dataset directory if given (e.g. data/eval_safety), else the bundled real fixtures (AV2 and
CommonRoad); every step (or every --stride-th) of every clip is one frame.

  bench_bev.py                         # fixtures
  bench_bev.py data/eval_safety --max-clips 20
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def _fixture_clips():
    from rad2_planner.adapters.av2 import load_av2_scenario
    from rad2_planner.adapters.commonroad import load_commonroad_scenario

    fx = ROOT / "tests" / "fixtures"
    return [
        load_av2_scenario(fx / "av2" / "0a1e6f0a-1817-4a98-b02e-db8c9327d151"),
        load_commonroad_scenario(fx / "commonroad" / "USA_US101-5_1_T-1.xml"),
    ]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("dataset", nargs="?", type=Path, help="dataset directory (default: test fixtures)")
    parser.add_argument("--max-clips", type=int, default=20, help="clips to use from a dataset (default 20)")
    parser.add_argument("--stride", type=int, default=1, help="use every N-th step (default 1)")
    args = parser.parse_args(argv)
    from rad2_planner.bev import get_config, rasterize_bev, snapshot_from_clip
    from rad2_planner.clip import iter_dataset
    from rad2_planner.observation import build_observation
    from rad2_planner.tokens import agent_tokens, map_tokens, route_tokens
    from tqdm import tqdm

    if args.dataset is not None:
        clips = []
        for c in iter_dataset(args.dataset):
            clips.append(c)
            if len(clips) >= args.max_clips:
                break
    else:
        clips = _fixture_clips()
    cfg = get_config(None)
    t_snap, t_bev, t_tok, t_obs = [], [], [], []
    frames = [(c, t) for c in clips for t in range(0, c.num_steps, args.stride)]
    # warm-up: per-map preparation happens once, reported separately
    t0 = time.perf_counter()
    for c in clips:
        rasterize_bev(snapshot_from_clip(c, 0))
    prep_ms = (time.perf_counter() - t0) * 1e3 / max(len(clips), 1)
    for c, t in tqdm(frames, desc="frames", unit="frame"):
        a = time.perf_counter()
        snap = snapshot_from_clip(c, t)
        b = time.perf_counter()
        rasterize_bev(snap)
        d = time.perf_counter()
        map_tokens(snap.map, snap.ego_pose, snap.route_lane_ids, snap.route_polyline)
        agent_tokens(snap.agents, snap.ego_pose)
        route_tokens(snap.route_polyline, snap.ego_pose)
        e = time.perf_counter()
        build_observation(snap)
        f = time.perf_counter()
        t_snap.append(b - a)
        t_bev.append(d - b)
        t_tok.append(e - d)
        t_obs.append(f - e)
    print(
        f"clips: {len(clips)}  frames: {len(frames)}  grid: {cfg.shape}  res {cfg.resolution} m  "
        f"supersample {cfg.supersample}"
    )
    print(f"first frame per map (incl. map preparation): {prep_ms:.2f} ms")
    for name, ts in (
        ("snapshot", t_snap),
        ("rasterize_bev", t_bev),
        ("tokens", t_tok),
        ("build_observation", t_obs),
    ):
        ms = np.asarray(ts) * 1e3
        print(
            f"{name:>18}: median {np.median(ms):6.2f} ms   p99 {np.percentile(ms, 99):6.2f} ms   "
            f"max {ms.max():6.2f} ms"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
