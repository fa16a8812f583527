"""Simulator benchmark (rad2 bench sim is the CLI): BEV warp time per frame (OpenCV warpAffine vs
torch grid_sample) and environment steps per second without a planner (single rollout and batched).
No ROS.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from rad2_core.config import resource_path

#: Default input: one logged clip of a bundled dataset (a benchmark takes no test fixtures).
DEFAULT_DATASET = "data/eval_efficiency"  # repository-relative (config.resource_path)


def bench_warp(params: dict, backends, batch_sizes, repeats: int) -> list[tuple[str, int, float]]:
    """ms per frame of each warp backend of ``backends`` (the choices of sim.warp_backend) per batch
    size, on the grid of ``params`` (params/bev.yaml as loaded)."""
    import numpy as np
    from bev_warp_sim.warp import BevWarper

    bev = params["bev"]
    warper = BevWarper(params)
    rng = np.random.default_rng(0)
    shape = (len(bev["channels"]), int(bev["height"]), int(bev["width"]))
    rows = []
    for b in batch_sizes:
        feats = rng.random((b,) + shape).astype(np.float32)
        ref = np.zeros((b, 3))
        sim = np.column_stack([rng.uniform(-2, 2, b), rng.uniform(-1, 1, b), rng.uniform(-0.1, 0.1, b)])
        for backend in backends:
            warper(feats, ref, sim, backend=backend)  # warm-up
            t0 = time.perf_counter()
            for _ in range(repeats):
                warper(feats, ref, sim, backend=backend)
            ms = (time.perf_counter() - t0) / repeats / b * 1e3
            rows.append((backend, b, ms))
    return rows


def _bench_simulator(params: dict, backend: str):
    """A simulator of ``params`` (every file of params/ as loaded, merged) with ``backend`` that never
    terminates early, and a zero control sequence."""
    import numpy as np
    from bev_warp_sim.simulator import Simulator
    from bev_warp_sim.state import Controls

    params = {**params, "sim": {**params["sim"], "warp_backend": backend, "terminate_on_collision": False,
                                "terminate_on_offroad": False}}
    sim = Simulator(params)
    return sim, Controls(np.zeros((sim.controller.horizon, 2)))


def _init_batch(sim, clips, b: int, steps: int):
    """``b`` rollouts over the clips in turn, start steps 0..4 in turn."""
    return sim.init([clips[i % len(clips)] for i in range(b)], [i % 5 for i in range(b)], max_steps=steps)


def bench_env(params: dict, clips, batch_sizes, steps: int, backend: str, progress: bool
              ) -> list[tuple[int, float, float]]:
    import numpy as np
    from tqdm import tqdm

    sim, u = _bench_simulator(params, backend)
    rows = []
    for b in batch_sizes:
        state = _init_batch(sim, clips, b, steps)
        n_steps = 0
        t0 = time.perf_counter()
        t_obs = 0.0
        for _ in tqdm(range(steps), desc=f"B={b}", disable=not progress, leave=False):
            need = np.flatnonzero(sim.needs_decision(state))
            if len(need):
                t1 = time.perf_counter()
                sim.observe(state, need)
                t_obs += time.perf_counter() - t1
                state = sim.commit(state, {int(i): u for i in need})
            running = int((~state.done).sum())
            if running == 0:
                break
            state, _ = sim.step(state)
            n_steps += running
        wall = time.perf_counter() - t0
        rows.append((b, n_steps / wall, t_obs / max(n_steps, 1) * 1e3))
    return rows


def bench_env_every_step(params: dict, clips, batch_sizes, steps: int, backend: str
                         ) -> list[tuple[int, float]]:
    """Observation at every step (as with h_reuse = 1), still without a planner."""
    import numpy as np

    sim, u = _bench_simulator(params, backend)
    rows = []
    for b in batch_sizes:
        state = _init_batch(sim, clips, b, steps)
        n = 0
        t0 = time.perf_counter()
        while not state.done.all():
            run = np.flatnonzero(~state.done)
            sim.observe(state, run)
            state = sim.commit(state, {int(i): u for i in run}, h_reuse=1)
            state, _ = sim.step(state)
            n += len(run)
        rows.append((b, n / (time.perf_counter() - t0)))
    return rows


def print_warp(console, warp_rows) -> None:
    """The warp table and the fastest backend per batch size."""
    from rich.table import Table

    t = Table(title="BEV warp, ms per frame (C x 128 x 128 float32)")
    for c in ("backend", "batch", "ms/frame"):
        t.add_column(c, justify="right")
    for backend, b, ms in warp_rows:
        t.add_row(backend, str(b), f"{ms:.3f}")
    console.print(t)
    fastest = {}
    for backend, b, ms in warp_rows:
        if b not in fastest or ms < fastest[b][1]:
            fastest[b] = (backend, ms)
    console.print("fastest per batch: " + ", ".join(f"B={b}: {v[0]}" for b, v in sorted(fastest.items())))


def bench_clips(dataset: str | Path | None) -> list:
    """The clips of ``dataset``, or the first clip of DEFAULT_DATASET."""
    from rad2_core.storage import load_clip, load_dataset, read_index

    if dataset:
        return load_dataset(dataset)
    default = resource_path(DEFAULT_DATASET)
    entry = read_index(default)["clips"][0]
    return [load_clip(default / entry["file"], maps_dir=default / "maps")]


def env_table(console, params: dict, backends, clips, batch_sizes, steps: int, progress: bool) -> list[dict]:
    """Latched and observe-every-step environment steps/s per warp backend and batch size (printed)."""
    from rich.table import Table

    longest = [c for c in clips if c.num_steps > steps + 6] or clips
    t = Table(title=f"Environment steps/s without a planner ({len(longest)} clips, {steps} steps)")
    for c in ("warp", "batch", "latched steps/s", "obs ms/step", "observe-every-step steps/s"):
        t.add_column(c, justify="right")
    env = []
    for backend in backends:
        rows = bench_env(params, longest, batch_sizes, steps, backend, progress)
        every = dict(bench_env_every_step(params, longest, batch_sizes, steps, backend))
        for b, sps, obs_ms in rows:
            t.add_row(backend, str(b), f"{sps:.0f}", f"{obs_ms:.2f}", f"{every[b]:.0f}")
            env.append({"backend": backend, "batch": b, "latched_steps_per_s": sps,
                        "observe_every_step_per_s": every[b]})
    console.print(t)
    return env


def run_sim_benchmark(params: dict, backends, batch_sizes: list[int], *, dataset: str | None = None,
                      steps: int = 60, warp_repeats: int = 20, warp_only: bool = False,
                      json_path: Path | None = None, progress: bool = True) -> dict:
    """The whole benchmark of rad2 bench sim; returns (and optionally writes) the JSON record.
    ``params``: every file of params/ as loaded, merged; ``backends``: the warp backends to time (the
    choices of sim.warp_backend)."""
    from rich.console import Console

    console = Console(width=max(Console().width, 120))
    load0 = os.getloadavg()[0]
    console.print(f"CPU cores visible: {os.cpu_count()}, load average: {os.getloadavg()}")
    warp_rows = bench_warp(params, backends, sorted(set([1] + list(batch_sizes))), warp_repeats)
    print_warp(console, warp_rows)
    report = {"load_before": load0, "env": [],
              "warp": [{"backend": k, "batch": b, "ms_per_frame": ms} for k, b, ms in warp_rows]}
    if not warp_only:
        report["env"] = env_table(console, params, backends, bench_clips(dataset), batch_sizes, steps,
                                  progress)
    report["load_after"] = os.getloadavg()[0]
    if json_path is not None:
        Path(json_path).write_text(json.dumps(report, indent=1))
    return report
