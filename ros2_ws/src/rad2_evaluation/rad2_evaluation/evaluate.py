"""Evaluate policies closed loop on dataset splits (rad2 eval policy): each policy on each split
with rad2_evaluation.closed_loop.evaluate_split, in this process or on Ray rollout workers
(rad2_training.workers), then the paper and full tables, results.json, table.md and the worst clips as
GIFs. No ROS.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any


def _runner(policy: str, params: dict, workers: int, checkpoint: str | None, decider_kwargs: dict):
    """(pool or None, decider or None, runner or None) for one policy; ``decider_kwargs``: the rad2
    policy's (checkpoint, traffic rules, backend, runtime overrides)."""
    if workers:
        from rad2_core.config import load_params
        from rad2_training.workers import PolicySpec, RolloutPool

        threads = int(load_params("training")["rollout"]["threads_per_worker"])
        spec = PolicySpec(name=policy, checkpoint_dir=checkpoint, threads=threads,
                          backend=decider_kwargs.get("backend"),
                          runtime_overrides=dict(decider_kwargs.get("runtime_overrides") or {}))
        pool = RolloutPool(spec, num_workers=workers, sim_params=params)
        return pool, None, pool.run
    from rad2_evaluation.closed_loop import make_decider

    return None, make_decider(policy, **(decider_kwargs if policy == "rad2" else {})), None  # loaded once


def _worker_batch(split: str, params: dict, workers: int, max_clips: int | None) -> int:
    """Several chunks per worker keep them all busy to the end."""
    from rad2_core.storage import read_index

    n = min(len(read_index(split)["clips"]), max_clips or 1 << 30)
    return max(1, min(int(params["evaluation"]["batch_size"]), -(-n // (4 * workers))))


def evaluate_policies(policies: list[str], splits: list[str], params: dict, console, *, workers: int = 0,
                      checkpoint: str | None = None, traffic_rules: bool = True, max_clips: int | None = None,
                      batch_size: int | None = None, h_reuse: int | None = None, seed: int = 0,
                      progress: bool = True, backend: str | None = None,
                      runtime_overrides: dict | None = None) -> list:
    """Every policy on every split (printing the throughput of each); returns the SplitEvaluations.
    ``backend``: the rad2 policy's network runtime (None: ``planner.backend``); ``runtime_overrides``:
    its ``runtime.*`` settings (``{"openvino": {"precision": "bf16"}}``).
    CheckpointError when the rad2 checkpoint does not load (in this process)."""
    from rad2_evaluation.closed_loop import evaluate_split

    kwargs: dict[str, Any] = {"checkpoint_dir": checkpoint} if checkpoint else {}
    if not traffic_rules:
        kwargs["traffic_rules"] = False
    if backend:
        kwargs["backend"] = backend
    if runtime_overrides:
        kwargs["runtime_overrides"] = runtime_overrides
    evals = []
    for policy in policies:
        pool, decider, runner = _runner(policy, params, workers, checkpoint, kwargs)
        try:
            for split in splits:
                t0 = time.perf_counter()
                batch = batch_size
                if workers and batch is None:
                    batch = _worker_batch(split, params, workers, max_clips)
                evals.append(evaluate_split(policy, split, params, max_clips=max_clips, batch_size=batch,
                                            h_reuse=h_reuse, progress=progress, decider=decider, seed=seed,
                                            runner=runner))
                st = evals[-1].stats
                wall = time.perf_counter() - t0
                sec = {k: f"{v:.1f} s" for k, v in st.seconds.items()}
                console.print(f"{policy} @ {Path(split).name}: {st.env_steps} env steps, {st.decisions} "
                              f"decisions in {wall:.1f} s wall ({st.env_steps / wall:.0f} steps/s); stage "
                              f"seconds summed over workers: plan {sec['plan']}, observe {sec['observe']}, "
                              f"track {sec['commit']}, step {sec['step']}")
        finally:
            if pool is not None:
                pool.close()
    return evals


def write_evaluation(evals: list, params: dict, out: Path, console, gifs: int | None = None) -> None:
    """Print the tables; write results.json, table.md and the worst clips' GIFs under ``out``."""
    from rad2_evaluation.closed_loop import (
        full_table,
        markdown_tables,
        paper_table,
        render_worst,
        write_json,
    )

    console.print(paper_table(evals))
    console.print(full_table(evals))
    out = Path(out)
    path = write_json(evals, out / "results.json")
    (out / "table.md").write_text(markdown_tables(evals) + "\n")
    n_gif = int(params["evaluation"]["worst_clips_gif"] if gifs is None else gifs)
    written = []
    for e in evals:
        written += render_worst(e, out / "gifs", n_gif, fps=float(params["evaluation"]["gif_fps"]))
    console.print(f"wrote {path}, {out / 'table.md'} and {len(written)} GIFs under {out / 'gifs'}")
