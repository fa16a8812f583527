"""Draw docs/figures/results_headline.png: the shipped planner against the selection baselines.

    .venv/bin/python docs/figures/make_results.py [--out docs/figures/results_headline.png]

The values are the headline table of docs/results.md (closed loop in BEV-Warp, log-replay agents, mean and
standard deviation over evaluation seeds: six on eval_safety, three elsewhere; no error bar where only the
mean was recorded). Re-measure them with the `rad2 eval experiments` command given there.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

PLANNERS = ("IL generator,\nuniform candidate", "IL generator,\nsafe_medoid rule", "rad2_rl\n(shipped)")
COLOURS = ("#b7b7b7", "#6fa8dc", "#e69138")
# panel title, y label, [(mean, std or None) per planner]
PANELS = (
    ("eval_safety (56 clips): collision rate", "CR (lower is better)",
     [(0.080, 0.014), (0.054, 0.018), (0.048, 0.013)]),
    ("eval_efficiency (54 clips): progress", "EP-Mean (higher is better)",
     [(0.934, 0.007), (0.954, 0.004), (0.959, 0.005)]),
    ("eval_rich (38 clips): collision rate", "CR (lower is better)",
     [(0.140, 0.033), (0.114, 0.012), (0.061, 0.012)]),
    ("eval_rich (38 clips): progress", "EP-Mean (higher is better)",
     [(0.874, None), (0.903, None), (0.935, 0.009)]),
)


def draw(out: Path) -> None:
    fig, axes = plt.subplots(1, len(PANELS), figsize=(16, 4.4))
    for ax, (title, ylabel, values) in zip(axes, PANELS, strict=True):
        x = range(len(PLANNERS))
        means = [m for m, _ in values]
        ax.bar(x, means, color=COLOURS, edgecolor="#333333")
        for i, (m, s) in enumerate(values):
            if s is not None:
                ax.errorbar(i, m, yerr=s, color="#222222", capsize=4)
            ax.annotate(f"{m:.3f}", (i, m + (s or 0)), ha="center", va="bottom", fontsize=8.5,
                        xytext=(0, 3), textcoords="offset points")
        if "EP-Mean" in ylabel:
            ax.set_ylim(0.8, 1.0)
        else:
            ax.set_ylim(0.0, max(m + (s or 0) for m, s in values) * 1.3)
        ax.set_xticks(list(x), PLANNERS, fontsize=8)
        ax.set_title(title, fontsize=10)
        ax.set_ylabel(ylabel, fontsize=9)
    fig.suptitle("Closed loop in BEV-Warp (log-replay agents), mean ± std over evaluation seeds", fontsize=11)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results_headline.png")
    draw(ap.parse_args().out)


if __name__ == "__main__":
    main()
