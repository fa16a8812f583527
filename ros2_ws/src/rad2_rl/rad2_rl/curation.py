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

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from bev_warp_sim.rollout import Rollout
from bev_warp_sim.simulator import clip_key


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
    from rad2_planner.clip import load_dataset, save_dataset

    out = Path(out_dir)
    dirs = (out / "rl_safety", out / "rl_efficiency")
    picks = ([c for c, v in zip(clips, verdicts) if v.keep_safety],
             [c for c, v in zip(clips, verdicts) if v.keep_efficiency])
    for d, chosen, what in zip(dirs, picks, ("safety", "efficiency")):
        save_dataset(chosen, d, description=f"RL training set ({what}-oriented), curated by "
                                            "tools/curate_scenarios.py (RAD-2 §4.1)")
        clash = overlapping(load_dataset(d), held_out)
        if clash:
            raise CurationError(f"{d}: clips {clash[:5]} are also in an evaluation set")
    return dirs
