"""RL training-set curation (RAD-2 §4.1): keep the pool clips the imitation policy finds hard.

Every pool clip is driven closed loop by the IL generator with a uniformly random candidate executed
at each decision (``curation.rollouts_per_clip`` rollouts, latched for ``curation.h_reuse`` steps). A
safety-oriented clip (its ``scenario_kind`` in ``curation.safety_kinds``) is kept when any rollout
collides or its minimum TTC falls below ``curation.safety_max_min_ttc_s``; an efficiency-oriented clip
(``curation.efficiency_kinds``) when the rollouts' mean progress ratio ρ is below
``curation.efficiency_max_mean_rho``; a clip of another kind is judged by both rules and goes to the set
of the rule it fails. Pool clips that also appear in an evaluation set (same clip id or same log
content) are dropped before anything runs, and the written sets are checked against the evaluation sets
again, so RL never trains on a held-out clip.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from bev_warp_sim.clip_registry import clip_key
from bev_warp_sim.rollout import Rollout


class CurationError(ValueError):
    """The curated sets would overlap an evaluation set, or the pool is empty."""


@dataclass
class ClipVerdict:
    clip_id: str
    kind: str
    orientation: str  # safety | efficiency | both (unknown kind)
    collisions: int
    min_ttc: float
    mean_rho: float
    keep_safety: bool
    keep_efficiency: bool


def composition(verdicts: Sequence[ClipVerdict]) -> list[dict[str, Any]]:
    """One row per scenario kind: pool clips, clips with a collision, kept for safety, for efficiency."""
    rows: dict[str, dict[str, Any]] = {}
    for v in verdicts:
        r = rows.setdefault(v.kind, {"kind": v.kind, "orientation": v.orientation, "pool": 0,
                                     "collided_clips": 0, "safety": 0, "efficiency": 0})
        r["pool"] += 1
        r["collided_clips"] += int(v.collisions > 0)
        r["safety"] += int(v.keep_safety)
        r["efficiency"] += int(v.keep_efficiency)
    return sorted(rows.values(), key=lambda r: r["kind"])


def overlapping(pool: Sequence[Any], held_out: Sequence[Any]) -> list[str]:
    """Ids of pool clips that are also in the held-out clips (by id or by log content)."""
    ids = {c.clip_id for c in held_out}
    keys = {clip_key(c).split("#", 1)[1] for c in held_out}
    return [c.clip_id for c in pool if c.clip_id in ids or clip_key(c).split("#", 1)[1] in keys]


def judge(clips: Sequence[Any], rollouts: Sequence[Rollout], cfg: dict[str, Any]) -> list[ClipVerdict]:
    """The keep/drop verdict of every clip from its group of rollouts (group g = clips[g])."""
    safety_kinds, eff_kinds = set(cfg["safety_kinds"]), set(cfg["efficiency_kinds"])
    by_group: dict[int, list[Rollout]] = {}
    for r in rollouts:
        by_group.setdefault(r.group, []).append(r)
    out = []
    for g, clip in enumerate(clips):
        group = by_group.get(g, [])
        if not group:
            raise CurationError(f"clip {clip.clip_id!r}: no rollouts")
        kind = clip.scenario_kind
        orientation = "safety" if kind in safety_kinds else "efficiency" if kind in eff_kinds else "both"
        collisions = sum(r.result.collided for r in group)
        min_ttc = float(min(r.result.min_ttc for r in group))
        mean_rho = float(np.mean([min(r.result.rho, 1.0) for r in group]))
        risky = collisions > 0 or min_ttc < float(cfg["safety_max_min_ttc_s"])
        slow = mean_rho < float(cfg["efficiency_max_mean_rho"])
        out.append(ClipVerdict(
            clip_id=clip.clip_id, kind=kind, orientation=orientation, collisions=int(collisions),
            min_ttc=min_ttc, mean_rho=mean_rho, keep_safety=risky and orientation in ("safety", "both"),
            keep_efficiency=slow and orientation in ("efficiency", "both") and not (
                orientation == "both" and risky)))
    return out


def write_sets(clips: Sequence[Any], verdicts: Sequence[ClipVerdict], out_dir: str | Path,
               held_out: Sequence[Any]) -> tuple[Path, Path]:
    """Write ``<out>/rl_safety`` and ``<out>/rl_efficiency`` and check them against the held-out clips."""
    from rad2_core.storage import load_dataset, save_dataset

    out = Path(out_dir)
    dirs = (out / "rl_safety", out / "rl_efficiency")
    picks = ([c for c, v in zip(clips, verdicts) if v.keep_safety],
             [c for c, v in zip(clips, verdicts) if v.keep_efficiency])
    for d, chosen, what in zip(dirs, picks, ("safety", "efficiency")):
        save_dataset(chosen, d, description=f"RL training set ({what}-oriented), curated by "
                                            "rad2 data curate (RAD-2 §4.1)")
        clash = overlapping(load_dataset(d), held_out)
        if clash:
            raise CurationError(f"{d}: clips {clash[:5]} are also in an evaluation set")
    return dirs


def plot_curation(verdicts, cfg, path: Path) -> None:
    """min TTC against mean progress per pool clip, the kept ones coloured, the criteria as lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4.5), dpi=100)
    for keep, colour, label in ((0, "0.6", "not kept"), (1, "tab:red", "kept (safety)"),
                                (2, "tab:blue", "kept (efficiency)")):
        pts = [(v.min_ttc, v.mean_rho) for v in verdicts
               if (keep == 1 and v.keep_safety) or (keep == 2 and v.keep_efficiency)
               or (keep == 0 and not (v.keep_safety or v.keep_efficiency))]
        if pts:
            x, y = zip(*pts)
            ax.scatter(x, y, s=14, c=colour, label=label, alpha=0.8)
    ax.axvline(float(cfg["safety_max_min_ttc_s"]), color="tab:red", ls="--", lw=0.8)
    ax.axhline(float(cfg["efficiency_max_mean_rho"]), color="tab:blue", ls="--", lw=0.8)
    ax.set_xlabel("min TTC over the clip's rollouts (s; 0 = collision)")
    ax.set_ylabel("mean ego progress ratio ρ (capped at 1)")
    ax.set_title("RL training-set curation (IL generator, random candidate)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


# --------------------------------------------------------------------------------------------------
# The whole curation run (rad2 data curate)
# --------------------------------------------------------------------------------------------------


def curation_rollouts(pool: Sequence[Any], group: int, *, checkpoint: str | None, workers: int, seed: int,
                      params: dict[str, Any], progress: bool = True):
    """``group`` rollouts per pool clip with the IL generator and a uniformly random candidate (in this
    process or on Ray workers; ``params``: every file of params/ as loaded, merged); returns (rollouts,
    stats)."""
    from tqdm import tqdm

    from rad2_training.workers import PolicySpec, RolloutPool

    cfg, rcfg = params["curation"], params["rollout"]
    threads = int(rcfg["threads_per_worker"]) if workers else None
    spec = PolicySpec(name="rad2", checkpoint_dir=checkpoint, selection="sample", distribution="uniform",
                      threads=threads)
    kwargs = dict(batch_size=int(rcfg["batch_size"]), seed=seed, h_reuse=int(cfg["h_reuse"]))
    with tqdm(total=len(pool) * group, unit="rollout", desc="curation rollouts", disable=not progress) as bar:
        if workers:
            with RolloutPool(spec, params, num_workers=workers) as pool_workers:
                return pool_workers.run(pool, group, progress=bar.update, **kwargs)
        from bev_warp_sim.rollout import run_rollouts
        from bev_warp_sim.simulator import Simulator

        return run_rollouts(Simulator(params), spec.build(params), pool, group, progress=bar.update, **kwargs)


def print_composition(console, rows: list[dict[str, Any]], out: str | Path) -> None:
    from rich.table import Table

    cols = ("kind", "orientation", "pool", "collided_clips", "safety", "efficiency")
    table = Table(title=f"Curated RL training sets ({out})")
    for col in cols:
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(*(str(r[k]) for k in cols))
    console.print(table)


def curate(pool_dirs: list[str], eval_dirs: list[str], out: str | Path, params: dict[str, Any], *,
           checkpoint: str | None = None,
           workers: int = 0, rollouts_per_clip: int | None = None, max_clips: int | None = None,
           seed: int | None = None, progress: bool = True, console: Any = None,
           skip_bad: bool = False) -> int:
    """Curate (see the module doc) and write the two sets, summary.json and curation.png into ``out``;
    returns an exit code (2: no pool clip outside the evaluation sets, 1: the sets overlap them).
    ``params``: every file of params/ as loaded, merged. Every pool clip is checked before the first
    rollout (bev_warp_sim.preflight): RefusedClipsError names the refused ones, or with ``skip_bad``
    they are left out and listed in summary.json."""
    from bev_warp_sim.preflight import RefusedClipsError, check_clips
    from bev_warp_sim.simulator import Simulator
    from rad2_core.storage import load_dataset
    from rich.console import Console

    console = console or Console()
    cfg, rcfg = params["curation"], params["rollout"]
    group = int(rollouts_per_clip or cfg["rollouts_per_clip"])
    seed = int(rcfg["seed"] if seed is None else seed)
    pool = [c for d in pool_dirs for c in load_dataset(d)]
    held_out = [c for d in eval_dirs for c in load_dataset(d)]
    clash = set(overlapping(pool, held_out))
    pool = [c for c in pool if c.clip_id not in clash][:max_clips]
    checked = check_clips(pool, Simulator(params), progress=progress)
    if checked.refused and not skip_bad:
        raise RefusedClipsError(checked.refused)
    for r in checked.refused:
        console.print(f"skipping refused clip {r}", markup=False)
    pool = checked.clips
    if not pool:
        console.print("[red]the pool holds no clips outside the evaluation sets[/red]")
        return 2
    console.print(f"pool: {len(pool)} clips ({len(clash)} dropped: also in an evaluation set); "
                  f"{group} rollouts each, h_reuse {cfg['h_reuse']}, uniformly random candidate")
    rollouts, stats = curation_rollouts(pool, group, checkpoint=checkpoint, workers=workers, seed=seed,
                                        params=params, progress=progress)
    verdicts = judge(pool, rollouts, cfg)
    try:
        dirs = write_sets(pool, verdicts, out, held_out)
    except CurationError as exc:
        console.print(f"[red]{exc}[/red]")
        return 1
    rows = composition(verdicts)
    print_composition(console, rows, out)
    summary = {
        "pool": pool_dirs, "eval": eval_dirs, "dropped_overlap": sorted(clash), "rollouts_per_clip": group,
        "seed": seed, "skipped": [r.as_dict() for r in checked.refused],
        "criteria": {k: cfg[k] for k in ("safety_max_min_ttc_s", "efficiency_max_mean_rho")},
        "composition": rows, "env_steps": stats.env_steps, "decisions": stats.decisions,
        "sets": {"safety": str(dirs[0]), "efficiency": str(dirs[1])},
        "clips": [v.__dict__ for v in verdicts],
    }
    out = Path(out)
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    plot_curation(verdicts, cfg, out / "curation.png")
    n_s = sum(v.keep_safety for v in verdicts)
    n_e = sum(v.keep_efficiency for v in verdicts)
    console.print(f"wrote {dirs[0]} ({n_s} clips), {dirs[1]} ({n_e} clips), {out / 'summary.json'}, "
                  f"{out / 'curation.png'}; {stats.env_steps} env steps in {stats.wall_s:.0f} s")
    return 0
