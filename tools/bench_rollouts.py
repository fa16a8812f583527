#!/usr/bin/env python3
"""Benchmark closed-loop rollout collection: environment steps/s and decisions/s of the rollout engine
(bev_warp_sim.rollout) with the real planner — M candidates, ONNX Runtime, the discriminator scoring
every candidate and the executed one sampled (softmax), latched for H_reuse steps — in this process and
in Ray workers, and of the simulator alone (fixed controls, no planner, no iLQR). Also prints the
pickled size of a simulator state. Prints the machine and the load before and after.

  bench_rollouts.py                                   # 8 clips x G = 4, H_reuse = 8, 1 process and 2 workers
  bench_rollouts.py --clips 16 --workers 0 2 --h-reuse 8 --out runs/bench_rollouts.md
"""

from __future__ import annotations

import argparse
import os
import pickle
import platform
import sys
import time
from pathlib import Path


def machine() -> str:
    model = platform.processor() or "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} logical CPUs"


def bench_simulator(clips, group: int, h_reuse: int, batch: int) -> tuple[int, float]:
    """Env steps and seconds of the simulator alone: one fixed control sequence per decision."""
    import numpy as np
    from bev_warp_sim.rollout import chunk_rows, expand_rows
    from bev_warp_sim.simulator import Controls, Simulator

    sim = Simulator()
    hold = Controls(np.zeros((sim.controller.horizon, 2)))
    steps, t0 = 0, time.perf_counter()
    for chunk in chunk_rows(expand_rows(clips, group), batch):
        state = sim.init([r.clip for r in chunk], [r.start_step for r in chunk])
        while not state.done.all():
            need = np.flatnonzero(sim.needs_decision(state))
            if len(need):
                sim.observe(state, need)
                state = sim.commit(state, {int(b): hold for b in need}, h_reuse=h_reuse)
            steps += int((~state.done).sum())
            state, _ = sim.step(state)
    return steps, time.perf_counter() - t0


def state_sizes(clip) -> tuple[int, int]:
    """Pickled bytes of a one-clip state at the start and after driving the whole clip."""
    import numpy as np
    from bev_warp_sim.simulator import Controls, Simulator

    sim = Simulator()
    state = sim.init([clip], [0])
    start = len(pickle.dumps(state))
    hold = Controls(np.zeros((sim.controller.horizon, 2)))
    while not state.done.all():
        if sim.needs_decision(state)[0]:
            state = sim.commit(state, {0: hold})
        state, _ = sim.step(state)
    return start, len(pickle.dumps(state))


def bench_planner(spec, clips, group: int, h_reuse: int, batch: int, workers: int):
    """(env steps, decisions, seconds) with the real planner in this process (0) or Ray workers."""
    from bev_warp_sim.rollout import run_rollouts
    from bev_warp_sim.simulator import Simulator

    kwargs = dict(batch_size=batch, h_reuse=h_reuse, seed=0)
    if workers == 0:
        decider, sim = spec.build(), Simulator()
        run_rollouts(sim, decider, clips[:1], 1, max_steps=4, **kwargs)  # warm-up (ONNX export, caches)
        t0 = time.perf_counter()
        _, stats = run_rollouts(sim, decider, clips, group, **kwargs)
        return stats.env_steps, stats.decisions, time.perf_counter() - t0
    from rad2_rl.workers import RolloutPool

    with RolloutPool(spec, num_workers=workers, address="") as pool:
        pool.run(clips[:workers], 1, max_steps=4, **kwargs)  # warm-up: every worker loaded
        t0 = time.perf_counter()
        _, stats = pool.run(clips, group, **kwargs)
        return stats.env_steps, stats.decisions, time.perf_counter() - t0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", default="data/eval_safety", help="dataset directory of the clips")
    ap.add_argument("--clips", type=int, default=8, help="clips (initial states)")
    ap.add_argument("--group", type=int, default=4, help="rollouts per initial state (G)")
    ap.add_argument("--h-reuse", type=int, default=8, help="steps each plan is executed (H_reuse)")
    ap.add_argument("--batch", type=int, default=16, help="rows stepped together per chunk")
    ap.add_argument("--candidates", type=int, default=32, help="M")
    ap.add_argument("--workers", type=int, nargs="+", default=[0, 2],
                    help="0: this process; N: N Ray workers")
    ap.add_argument("--out", default=None, help="also write the table as Markdown to this file")
    args = ap.parse_args(argv)
    if min(args.clips, args.group, args.h_reuse, args.batch, args.candidates) < 1 or min(args.workers) < 0:
        ap.error("--clips, --group, --h-reuse, --batch, --candidates must be >= 1 and --workers >= 0")
    if not (Path(args.dataset) / "index.json").is_file():
        ap.error(f"--dataset: {args.dataset} is not a dataset directory (no index.json)")

    from rad2_planner.clip import load_dataset
    from rad2_planner.config import load_params
    from rad2_rl.workers import PolicySpec
    from rich.console import Console

    console = Console(width=max(Console().width, 120))
    clips = load_dataset(args.dataset)[: args.clips]
    load0 = os.getloadavg()[0]
    threads = int(load_params("training")["rollout"]["threads_per_worker"])
    sim_steps, sim_s = bench_simulator(clips, args.group, args.h_reuse, args.batch)
    rows = [("simulator alone (fixed controls)", 0, sim_steps, 0, sim_s)]
    for w in args.workers:
        spec = PolicySpec(name="rad2", backend="onnxruntime", selection="sample", distribution="softmax",
                          always_score=True, threads=None if w == 0 else threads,
                          planner_overrides={"num_candidates": args.candidates})
        label = "real planner, 1 process" if w == 0 else f"real planner, {w} Ray workers x {threads} thread"
        rows.append((label, w, *bench_planner(spec, clips, args.group, args.h_reuse, args.batch, w)))
    start_b, end_b = state_sizes(clips[0])
    head = (f"machine: {machine()}; load average {load0:.2f} before, {os.getloadavg()[0]:.2f} after; "
            f"{len(clips)} clips x G = {args.group}, H_reuse = {args.h_reuse}, M = {args.candidates}, "
            f"batch {args.batch}")
    lines = [head, "", "| setting | env steps | decisions | wall s | env steps/s | decisions/s |",
             "| --- | --- | --- | --- | --- | --- |"]
    for label, _, steps, decisions, secs in rows:
        lines.append(f"| {label} | {steps} | {decisions} | {secs:.1f} | {steps / secs:.0f} | "
                     f"{decisions / secs:.1f} |")
    lines += ["", f"pickled one-clip state: {start_b} bytes at the start, {end_b} bytes after "
                  f"{clips[0].num_steps - 1} steps ({clips[0].clip_id})"]
    text = "\n".join(lines)
    console.print(text)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
