"""Evaluate policies closed loop on dataset splits (the ``eval_policy`` command): each policy on each split
with rad2_evaluation.closed_loop.evaluate_split, in this process or on Ray rollout workers
(rad2_training.workers), then the paper and full tables, results.json, table.md, a summary figure per
split and the worst clips as GIFs. No ROS.

Every clip is checked before the first rollout (:mod:`bev_warp_sim.preflight`): a refused clip stops the
run with the list of all of them, or, with ``skip_bad``, is left out and reported. Each finished chunk
of clips goes to ``<out>/episodes.jsonl`` at once (:mod:`rad2_evaluation.episode_log`), so a run that
is interrupted keeps what it drove and ``resume`` continues it.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

# evaluation.* settings that change no episode (what is drawn and timed afterwards): not part of the
# settings a resumed run must share
PRESENTATION_KEYS = ("worst_clips_gif", "gif_fps", "latency_cycles")


def _runner(policy: str, params: dict, workers: int, checkpoint: str | None, decider_kwargs: dict):
    """(pool or None, decider or None, runner or None) for one policy; ``params``: every file of
    params/ as loaded, merged; ``decider_kwargs``: the rad2 policy's (checkpoint, traffic rules,
    backend, runtime overrides)."""
    if workers:
        from rad2_training.workers import PolicySpec, RolloutPool

        threads = int(params["rollout"]["threads_per_worker"])
        spec = PolicySpec(name=policy, checkpoint_dir=checkpoint, threads=threads,
                          backend=decider_kwargs.get("backend"),
                          runtime_overrides=dict(decider_kwargs.get("runtime_overrides") or {}))
        pool = RolloutPool(spec, params, num_workers=workers)
        return pool, None, pool.run_chunks
    from rad2_evaluation.closed_loop import make_decider

    return None, make_decider(policy, params, **(decider_kwargs if policy == "rad2" else {})), None  # once


def _worker_batch(n_clips: int, params: dict, workers: int) -> int:
    """Several chunks per worker keep them all busy to the end."""
    return max(1, min(int(params["evaluation"]["batch_size"]), -(-n_clips // (4 * workers))))


def policy_settings(policy: str, files: dict, *, batch_size: int | None, h_reuse: int | None,
                    max_clips: int | None, workers: int, checkpoint: str | None, traffic_rules: bool,
                    backend: str | None, runtime_overrides: dict | None) -> dict[str, Any]:
    """Every setting that changes ``policy``'s episodes (what a resumed run must share): the simulator's
    parameters, the replanning period, and for the learned policy its planner parameters, weights,
    runtime and how its calls are batched (the network's rounding follows the batch composition and the
    thread count; the reference policies' plans do not). ``files``: every file of params/ as loaded,
    by name."""
    import copy

    from rad2_core.config import merge_runtime_overrides

    params = files["sim"]
    sim = copy.deepcopy(params)
    ev = sim.get("evaluation", {})
    for key in (*PRESENTATION_KEYS, "batch_size", "h_reuse"):
        ev.pop(key, None)
    settings: dict[str, Any] = {"sim": sim, "h_reuse": int(h_reuse if h_reuse is not None
                                                           else params["evaluation"]["h_reuse"])}
    if policy != "rad2":
        return settings
    from rad2_planner.policy import resolve_path

    from rad2_evaluation.episode_log import checkpoint_digest

    planner = copy.deepcopy(files["planner"])
    if runtime_overrides:
        merge_runtime_overrides(planner["runtime"], runtime_overrides)
    if not traffic_rules:
        planner["traffic_rules"]["enabled"] = False
    ckpt = resolve_path(checkpoint or planner["planner"]["checkpoint_dir"])
    threads = (int(files["training"]["rollout"]["threads_per_worker"]) if workers
               else planner["runtime"]["ort_intra_op_threads"])
    # the batch size as asked (with workers, None is a per-split size that follows the worker count)
    settings.update(planner=planner, checkpoint=str(ckpt), checkpoint_weights=checkpoint_digest(ckpt),
                    backend=backend or planner["planner"]["backend"],
                    batch_size=batch_size if batch_size is not None or workers
                    else int(params["evaluation"]["batch_size"]),
                    workers=int(workers), max_clips=max_clips, threads=threads)
    return settings


def evaluate_policies(policies: list[str], splits: list[str], files: dict, console, *, workers: int = 0,
                      checkpoint: str | None = None, traffic_rules: bool = True, max_clips: int | None = None,
                      batch_size: int | None = None, h_reuse: int | None = None, seed: int = 0,
                      progress: bool = True, backend: str | None = None,
                      runtime_overrides: dict | None = None, out: str | Path | None = None,
                      resume: bool = False, skip_bad: bool = False, keep_worst: int | None = None) -> list:
    """Every policy on every split (printing the throughput of each); returns the SplitEvaluations.
    ``files``: every file of params/ as loaded (with the run's simulator overrides), by name.
    ``backend``: the rad2 policy's network runtime (None: ``planner.backend``); ``runtime_overrides``:
    its ``runtime.*`` settings (``{"openvino": {"precision": "bf16"}}``).

    Before any rollout every clip is checked: RefusedClipsError lists the refused ones unless
    ``skip_bad``. ``out``: finished episodes go to ``out/episodes.jsonl`` as they come; ``resume``
    continues the run there (SettingsMismatch when a setting differs). ``keep_worst``: episodes per
    split whose decisions are kept for GIFs (default ``evaluation.worst_clips_gif``).
    CheckpointError when the rad2 checkpoint does not load (in this process)."""
    from bev_warp_sim.preflight import check_splits
    from bev_warp_sim.simulator import Simulator
    from rad2_core.config import merged

    from rad2_evaluation.closed_loop import evaluate_split
    from rad2_evaluation.episode_log import EpisodeLog

    params = merged(files, *files)
    sim = Simulator(params)
    checked = check_splits(splits, sim, max_clips=max_clips, skip_bad=skip_bad, progress=progress)
    for c in checked:
        if c.refused:
            console.print(f"[yellow]{Path(c.split).name}: skipping {len(c.refused)} refused clip(s):[/]")
            for r in c.refused:
                console.print(f"  {r}", markup=False)
    n_keep = int(params["evaluation"]["worst_clips_gif"] if keep_worst is None else keep_worst)
    kwargs: dict[str, Any] = {"checkpoint_dir": checkpoint} if checkpoint else {}
    if not traffic_rules:
        kwargs["traffic_rules"] = False
    if backend:
        kwargs["backend"] = backend
    if runtime_overrides:
        kwargs["runtime_overrides"] = runtime_overrides

    def batch_of(c) -> int:
        if batch_size is not None:
            return int(batch_size)
        if workers:
            return _worker_batch(len(c.clips), params, workers)
        return int(params["evaluation"]["batch_size"])

    log = EpisodeLog(out, resume=resume) if out is not None else None
    evals = []
    try:
        if log is not None:  # all policies' settings first: a mismatch stops the run before any rollout
            for policy in policies:
                log.use_settings(policy, policy_settings(
                    policy, files, batch_size=batch_size,
                    h_reuse=h_reuse, max_clips=max_clips, workers=workers, checkpoint=checkpoint,
                    traffic_rules=traffic_rules, backend=backend, runtime_overrides=runtime_overrides))
        for policy in policies:
            pending = [c for c in checked if c.clips and not _all_done(log, policy, c, seed)]
            pool = decider = runner = None
            if pending:  # nothing to load when every episode is already in the log
                pool, decider, runner = _runner(policy, params, workers, checkpoint, kwargs)
            try:
                for c in checked:
                    if not c.clips:
                        console.print(f"{policy} @ {Path(c.split).name}: no clip left to drive")
                        continue
                    t0 = time.perf_counter()
                    ev = evaluate_split(policy, c.split, params, batch_size=batch_of(c), h_reuse=h_reuse,
                                        progress=progress, decider=decider, seed=seed, runner=runner,
                                        simulator=sim, checked=c, log=log, keep_worst=n_keep)
                    evals.append(ev)
                    _print_throughput(console, ev, time.perf_counter() - t0)
            finally:
                if pool is not None:
                    pool.close()
    finally:
        if log is not None:
            log.close()
    return evals


def _all_done(log, policy: str, checked, seed: int) -> bool:
    if log is None:
        return False
    from bev_warp_sim.clip_registry import clip_key

    done = log.done(policy, checked.split, seed)
    return all(clip_key(c) in done for c in checked.clips)


def _print_throughput(console, ev, wall: float) -> None:
    st = ev.stats
    name = f"{ev.policy} @ {Path(ev.split).name}"
    again = f" ({ev.resumed} episodes read back from the earlier run)" if ev.resumed else ""
    if not st.env_steps:
        console.print(f"{name}: every episode was already finished{again}")
        return
    sec = {k: f"{v:.1f} s" for k, v in st.seconds.items()}
    console.print(f"{name}: {st.env_steps} env steps, {st.decisions} decisions in {wall:.1f} s wall "
                  f"({st.env_steps / wall:.0f} steps/s){again}; stage seconds summed over workers: plan "
                  f"{sec['plan']}, observe {sec['observe']}, track {sec['commit']}, step {sec['step']}")


def write_evaluation(evals: list, params: dict, out: Path, console, gifs: int | None = None,
                     progress: bool = True) -> None:
    """Print the tables; write results.json, table.md, summary_<split>.png and the worst clips' GIFs
    under ``out``."""
    from rad2_evaluation.closed_loop import (
        full_table,
        markdown_tables,
        paper_table,
        plot_split_summary,
        render_worst,
        skipped_note,
        write_json,
    )

    console.print(paper_table(evals))
    console.print(full_table(evals))
    out = Path(out)
    path = write_json(evals, out / "results.json")
    note = skipped_note(evals)
    (out / "table.md").write_text(markdown_tables(evals) + "\n" + (f"\n{note}\n" if note else ""))
    figures = []
    for split in dict.fromkeys(e.split for e in evals):
        figures.append(plot_split_summary([e for e in evals if e.split == split],
                                          out / f"summary_{Path(split).name}.png"))
    from tqdm import tqdm

    n_gif = int(params["evaluation"]["worst_clips_gif"] if gifs is None else gifs)
    written = []
    with tqdm(total=sum(min(n_gif, len(e.results)) for e in evals), desc="GIFs of the worst clips",
              unit="gif", disable=not progress) as bar:
        for e in evals:
            written += render_worst(e, out / "gifs", n_gif, fps=float(params["evaluation"]["gif_fps"]),
                                    progress=bar.update)
    console.print(f"wrote {path}, {out / 'table.md'}, {len(figures)} summary figures "
                  f"({', '.join(p.name for p in figures)}) and {len(written)} GIFs under {out / 'gifs'}")
