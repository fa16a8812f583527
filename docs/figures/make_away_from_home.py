"""The figure of the README's held-out table: per planner, the nuPlan-style score and the share of
at-fault and off-road drives on the held-out INTERACTION test files and on the NGSIM test split.

Usage: python docs/figures/make_away_from_home.py OUT.png EPISODES.jsonl [EPISODES.jsonl ...]
(the episodes.jsonl files of `rad2 eval experiments` runs; one row per run label and split).
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def main(out: str, paths: list[str]) -> None:
    rows: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for path in paths:
        with open(path) as f:
            for line in f:
                e = json.loads(line)
                run = e["run"].replace("ckpt:checkpoints/", "")
                rows[(run, e["split"].rstrip("/").split("/")[-1])].append(e["result"])
    splits = sorted({s for _, s in rows})
    runs = sorted({r for r, _ in rows})
    fig, axes = plt.subplots(1, 3, figsize=(13, 4.2))
    width = 0.8 / max(len(splits), 1)
    for j, split in enumerate(splits):
        have = [r for r in runs if (r, split) in rows]
        x = np.array([runs.index(r) for r in have]) + (j - (len(splits) - 1) / 2) * width
        for ax, (name, fn) in zip(axes, (
                ("score", lambda rs: np.mean([r["score"] for r in rs])),
                ("at-fault drives (share)", lambda rs: np.mean([r["at_fault"] for r in rs])),
                ("off-road drives (share)", lambda rs: np.mean([r["offroad"] for r in rs])))):
            ax.bar(x, [fn(rows[(r, split)]) for r in have], width, label=f"{split}")
            ax.set_title(name)
    for ax in axes:
        ax.set_xticks(range(len(runs)), runs, rotation=35, ha="right", fontsize=8)
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle("Closed loop, log-replay agents, seed 0: held-out INTERACTION test files and the NGSIM "
                 "test split")
    fig.tight_layout()
    fig.savefig(out, dpi=90)


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2:])
