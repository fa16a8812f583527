"""The collision critic's training run (rad2 train critic): data, training, the warning report.

:func:`load_or_build` drives and labels clips with the shipped planner (rad2_training.critic_data) and caches
the datasets, extending a cache of fewer clips of the same order and settings; :func:`fit` holds out
validation clips and trains; :func:`warning_report` scores the held-out test split per threshold;
:func:`write_outputs` saves the checkpoint, the report files and the figures. No ROS.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from rad2_training.critic_data import (
    THRESHOLDS,
    CriticDataset,
    collect_critic_dataset,
    predict,
    train_critic,
    warning_statistics,
    warning_table,
)


def pick_clips(split: str, n: int, seed: int) -> list:
    """``n`` clips of ``split`` (0: all) in a seeded random order (the index lists clips kind by kind,
    so its head would hold only one or two scenario kinds)."""
    import numpy as np
    from rad2_core.storage import load_dataset

    clips = load_dataset(split)
    order = np.random.default_rng(seed).permutation(len(clips))
    return [clips[i] for i in order[: (n or len(clips))]]


def build(split: str, n: int, path: Path, policy, sim, *, horizon_s: float, h_reuse: int, chunk_clips: int,
          seed: int, cached: CriticDataset | None = None) -> CriticDataset:
    """Drive and label ``n`` clips of ``split``; clips already in ``cached`` (a dataset built with the
    same settings from a prefix of the same clip order) are reused, only the rest are driven."""
    from tqdm import tqdm

    clips = pick_clips(split, n, seed)
    reuse = 0
    if cached is not None and [c.clip_id for c in clips[: len(cached.clip_ids)]] == cached.clip_ids:
        reuse = len(cached.clip_ids)
    t0 = time.perf_counter()
    with tqdm(total=len(clips) - reuse, desc=f"labelling {Path(split).name}", unit="clip") as bar:
        new = collect_critic_dataset(policy, clips[reuse:], horizon_s, sim=sim, h_reuse=h_reuse,
                                     chunk_clips=chunk_clips, seed=seed, progress=bar.update)
    data = CriticDataset.concatenate([cached, new]) if reuse else new
    wall = time.perf_counter() - t0 + (float(cached.meta.get("build_wall_s", 0.0)) if reuse else 0.0)
    data.meta.update(
        {
            **new.meta,
            "clips": len(clips),
            "split": split,
            "requested_clips": n,
            "build_wall_s": wall,
            "dropped_incomplete_horizon": new.meta["dropped_incomplete_horizon"]
            + (int(cached.meta.get("dropped_incomplete_horizon", 0)) if reuse else 0),
        }
    )
    if reuse:
        print(f"{Path(split).name}: reused the {reuse} clips of the cache, drove {len(clips) - reuse}")
    data.save(path)
    return data


def _usable_cache(path: Path, want: dict[str, Any], n: int, name: str) -> tuple[Any, Any]:
    """(the cache when it matches ``want`` exactly, else None; a cache to extend, else None)."""
    data = CriticDataset.load(path)
    have = {k: data.meta.get(k) for k in want}
    if have == want:
        print(f"{name}: cached {path} ({data.summary()})")
        return data, None
    print(f"{name}: cache {path} was built with {have}, want {want}")
    same = all(have[k] == want[k] for k in want if k != "requested_clips")
    return None, (data if same and (n == 0 or len(data.clip_ids) < n) else None)


def load_or_build(sets: dict[str, tuple[str, int]], data_dir: Path, params: dict[str, Any], *,
                  horizon_s: float, h_reuse: int, chunk_clips: int, seed: int, rebuild: bool = False
                  ) -> tuple[dict, dict[str, Path]]:
    """The labelled datasets ``name -> (split, clips)`` from the cache in ``data_dir`` or built anew
    (the planner and simulator are made only when something must be driven; ``params``: every file of
    params/ as loaded, merged); returns (datasets, their paths)."""
    from bev_warp_sim.simulator import Simulator
    from rad2_planner.policy import Rad2Policy
    from rad2_planner.safety_layer import SafetyLayerParams

    paths = {name: Path(data_dir) / f"{name}.npz" for name in sets}
    policy = None
    datasets = {}
    for name, (split, n) in sets.items():
        want = {"split": split, "requested_clips": n, "horizon_s": horizon_s, "h_reuse": h_reuse,
                "seed": seed}
        cached = None
        if paths[name].is_file() and not rebuild:
            exact, cached = _usable_cache(paths[name], want, n, name)
            if exact is not None:
                datasets[name] = exact
                continue
        if policy is None:
            policy = Rad2Policy.from_params(
                params, safety_layer=replace(SafetyLayerParams.from_params(params), mode="off"))
            sim = Simulator(params)
        d = datasets[name] = build(split, n, paths[name], policy, sim, horizon_s=horizon_s, h_reuse=h_reuse,
                                   chunk_clips=chunk_clips, seed=seed, cached=cached)
        print(f"{name}: built {paths[name]} in {d.meta['build_wall_s']:.0f} s, "
              f"{paths[name].stat().st_size / 1e6:.1f} MB: {d.summary()}")
    return datasets, paths


def split_validation(train_all: CriticDataset,
                     val_fraction: float) -> tuple[CriticDataset, CriticDataset, int]:
    """The last ``val_fraction`` of the clips held out (the clip order is already seeded-random);
    returns (training part, validation part, number of validation clips)."""
    n_clips = len(train_all.clip_ids)
    n_val = int(round(val_fraction * n_clips))
    is_val = np.isin(train_all.rollout, np.arange(n_clips - n_val, n_clips))
    return train_all.subset(np.flatnonzero(~is_val)), train_all.subset(np.flatnonzero(is_val)), n_val


def fit(train: CriticDataset, val: CriticDataset, cfg, *, epochs: int, **hyper) -> tuple[Any, list, float]:
    """Train with a progress bar; returns (critic, history, wall seconds)."""
    from tqdm import tqdm

    t0 = time.perf_counter()
    with tqdm(total=epochs, desc="training", unit="epoch") as bar:

        def report(row):
            bar.update(1)
            shown = ("train_loss", "val_loss", "val_ap")
            bar.set_postfix({k: f"{v:.3f}" for k, v in row.items() if k in shown})

        critic, history = train_critic(train, val if len(val) else None, cfg, epochs=epochs, progress=report,
                                       **hyper)
    return critic, history, time.perf_counter() - t0


def warning_report(critic, test: CriticDataset) -> tuple[dict, list[dict], str]:
    """Warning statistics at the reported thresholds, the curve over thresholds 0.05..0.95, the table."""
    probs = predict(critic, test)
    stats = warning_statistics(probs, test, THRESHOLDS)
    curve = []
    for thr in np.round(np.arange(0.05, 0.96, 0.05), 2):
        row = warning_statistics(probs, test, (float(thr),))["thresholds"][f"{thr:g}"]
        curve.append({"threshold": float(thr), **row})
    return stats, curve, warning_table(stats)


def write_outputs(out: Path, critic, info: dict, stats: dict, curve: list[dict], table: str, *,
                  test_split: str, horizon_s: float, seed: int) -> None:
    """The checkpoint (with ``info``), warnings.json / .md and the two figures."""
    out = Path(out)
    critic.save(out, info)
    (out / "warnings.json").write_text(json.dumps(
        {"test_split": test_split, "horizon_s": horizon_s, "statistics": stats, "curve": curve}, indent=1))
    (out / "warnings.md").write_text(
        f"Collision-critic warnings on {test_split} (held out), k = {horizon_s:g} s, seed {seed}\n\n"
        f"{table}\n")
    plot_training(info["history"], out / "training_curve.png")
    plot_warnings(curve, stats, out / "warnings.png")


def plot_training(history: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ep = [h["epoch"] for h in history]
    fig, ax = plt.subplots(1, 2, figsize=(9, 3.4))
    ax[0].plot(ep, [h["train_loss"] for h in history], "o-", label="train")
    if "val_loss" in history[0]:
        ax[0].plot(ep, [h["val_loss"] for h in history], "s-", label="validation clips")
        ax[1].plot(ep, [h["val_ap"] for h in history], "s-", color="tab:green")
        kept = max(history, key=lambda h: h["val_ap"])["epoch"]
        for a in ax:
            a.axvline(kept, color="0.5", ls=":", lw=1)
        ax[1].annotate(
            "kept",
            (kept, max(h["val_ap"] for h in history)),
            textcoords="offset points",
            xytext=(4, -10),
            fontsize=8,
        )
    ax[0].set(xlabel="epoch", ylabel="class-balanced BCE", title="loss")
    ax[0].legend()
    ax[1].set(xlabel="epoch", ylabel="average precision", title="validation AP (all candidates)")
    for a in ax:
        a.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_warnings(curve: list[dict], stats: dict, path: Path) -> None:
    """Precision / recall and lead time against the threshold, the reported thresholds marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    thr = [c["threshold"] for c in curve]
    fig, ax = plt.subplots(1, 2, figsize=(9, 3.4))
    for key, style in (("precision", "-"), ("recall", "--")):
        ax[0].plot(thr, [c["candidates"][key] for c in curve], style, color="tab:blue", label=f"{key}, all")
        ax[0].plot(
            thr, [c["executed"][key] for c in curve], style, color="tab:orange", label=f"{key}, executed"
        )
    ax[1].plot(thr, [c["candidates"]["mean_lead_s"] for c in curve], "-", label="true warnings, all")
    ax[1].plot(thr, [c["executed"]["mean_lead_s"] for c in curve], "-", label="true warnings, executed")
    ax[1].plot(
        thr,
        [c["events"]["mean_first_warning_lead_s"] for c in curve],
        ":",
        label="first warning before a closed-loop collision",
    )
    for a in ax:
        for t in stats["thresholds"]:
            a.axvline(float(t), color="0.8", lw=0.8)
        a.set_xlabel("threshold")
        a.grid(alpha=0.3)
        a.legend(fontsize=7)
    ax[0].set(
        ylabel="precision / recall",
        ylim=(0, 1.02),
        title=f"test AP {stats['average_precision']:.2f} (all), {stats['average_precision_executed']:.2f} "
        "(executed)",
    )
    ax[1].set(ylabel="s", title="mean lead time")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def train_and_report(
    *,
    command: str,
    train_split: str,
    train_clips: int,
    test_split: str,
    test_clips: int,
    data_dir: str,
    rebuild: bool,
    build_only: bool,
    horizon_s: float | None,
    h_reuse: int | None,
    chunk_clips: int,
    val_fraction: float,
    epochs: int,
    batch_size: int,
    candidates_per_decision: int,
    lr: float,
    weight_decay: float,
    d_model: int,
    blocks: int,
    max_agents: int,
    threads: int,
    seed: int,
    out: str,
    params: dict[str, Any],
) -> dict[str, Any] | None:
    """The whole run of rad2 train critic (its flags as keywords); returns the checkpoint's info
    record, or None with ``build_only``. ``horizon_s`` / ``h_reuse`` None: the plan horizon and
    evaluation.h_reuse of ``params`` (every file of params/ as loaded, merged)."""
    import torch
    from rad2_planner.networks.critic import CriticConfig

    t_start = time.perf_counter()
    planner = params["planner"]
    plan_points, plan_dt = int(planner["plan_points"]), float(planner["plan_dt"])
    horizon_s = plan_points * plan_dt if horizon_s is None else horizon_s
    h_reuse = int(params["evaluation"]["h_reuse"]) if h_reuse is None else h_reuse
    torch.set_num_threads(threads)
    datasets, paths = load_or_build({"train": (train_split, train_clips), "test": (test_split, test_clips)},
                                    Path(data_dir), params, horizon_s=horizon_s, h_reuse=h_reuse,
                                    chunk_clips=chunk_clips, seed=seed, rebuild=rebuild)
    if build_only:
        return None
    test = datasets["test"]
    train, val, n_val = split_validation(datasets["train"], val_fraction)
    n_clips = len(datasets["train"].clip_ids)
    cfg = CriticConfig(plan_points=plan_points, plan_dt=plan_dt, horizon_s=horizon_s, d_model=d_model,
                       num_blocks=blocks, max_agents=max_agents)
    print(
        f"training on {len(train)} decisions ({train.collides.size} candidates, positive share "
        f"{train.collides.mean():.3f}) of {n_clips - n_val} clips; validation {len(val)} decisions of "
        f"{n_val} clips"
    )
    hyper = {"epochs": epochs, "batch_size": batch_size, "candidates_per_decision": candidates_per_decision,
             "lr": lr, "weight_decay": weight_decay}
    critic, history, train_wall = fit(train, val, cfg, seed=seed, **hyper)
    stats, curve, table = warning_report(critic, test)
    print(f"\nCollision-critic warnings on {test_split} ({len(test.clip_ids)} clips, held out), "
          f"horizon k = {horizon_s:g} s:\n{table}")
    info = run_info(command, seed, {**hyper, "val_fraction": val_fraction, "h_reuse": h_reuse}, datasets,
                    paths, train, val, critic, train_wall, t_start, history, stats)
    write_outputs(Path(out), critic, info, stats, curve, table, test_split=test_split, horizon_s=horizon_s,
                  seed=seed)
    hw = info["hardware"]
    print(f"\n{critic.num_parameters} parameters; training {train_wall:.0f} s, "
          f"total {info['total_wall_s']:.0f} s on {hw['cpu']} ({hw['logical_cpus']} logical CPUs, "
          f"load {hw['load_average'][0]:.2f}); wrote {out}/")
    return info


def run_info(command: str, seed: int, hyper: dict[str, Any], datasets: dict, paths: dict, train, val, critic,
             train_wall: float, t_start: float, history: list, stats: dict) -> dict[str, Any]:
    """The record kept in the checkpoint's config.json: command, data, sizes, wall times, hardware."""
    from rad2_core.machine import hardware_record

    return {
        "command": command,
        "seed": seed,
        "hyper_parameters": hyper,
        "data": {
            name: {**d.summary(), "file": str(paths[name]), "bytes": paths[name].stat().st_size,
                   "build_wall_s": d.meta.get("build_wall_s"), "split": d.meta.get("split")}
            for name, d in datasets.items()
        },
        "train_decisions": len(train),
        "val_decisions": len(val),
        "parameters": critic.num_parameters,
        "training_wall_s": train_wall,
        "total_wall_s": time.perf_counter() - t_start,
        "hardware": hardware_record(),
        "history": history,
        "test": dict(stats),
    }
