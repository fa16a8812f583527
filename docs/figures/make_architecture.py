"""Draw docs/figures/architecture.png: rad2's packages and its data flow.

    .venv/bin/python docs/figures/make_architecture.py [--out docs/figures/architecture.png]

Top row: one planning cycle, from a clip or the vehicle's sensors to the control command. Middle row:
the training loop around the same planner. Bottom band: the ROS 2 layer and the package dependencies.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch  # noqa: E402

COLOURS = {
    "data": "#d9ead3",
    "planner": "#cfe2f3",
    "control": "#fce5cd",
    "sim": "#ead1dc",
    "training": "#fff2cc",
    "ros": "#e6e6e6",
}


def box(ax, x, y, w, h, title, body, package, kind):
    ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.02,rounding_size=0.08",
                                fc=COLOURS[kind], ec="#444444", lw=1.2))
    ax.text(x + w / 2, y + h - 0.17, title, ha="center", va="top", fontsize=10.5, weight="bold")
    ax.text(x + w / 2, y + h - 0.52, body, ha="center", va="top", fontsize=8.3, linespacing=1.35)
    ax.text(x + w / 2, y + 0.1, package, ha="center", va="bottom", fontsize=8, family="monospace",
            color="#333333")


def arrow(ax, start, end, label="", rad=0.0, colour="#222222", style="-|>", offset=(0.0, 0.12)):
    ax.add_patch(FancyArrowPatch(start, end, arrowstyle=style, mutation_scale=14, lw=1.4, color=colour,
                                 connectionstyle=f"arc3,rad={rad}"))
    if label:
        mx, my = (start[0] + end[0]) / 2 + offset[0], (start[1] + end[1]) / 2 + offset[1]
        ax.text(mx, my, label, ha="center", va="bottom", fontsize=7.6, color=colour, style="italic")


def draw(out: Path) -> None:
    fig, ax = plt.subplots(figsize=(17, 10.3))
    ax.set_xlim(0, 17)
    ax.set_ylim(0, 10.3)
    ax.axis("off")
    ax.text(0.2, 10.2, "rad2: one planning cycle (top), the training loop (middle), the ROS 2 layer (bottom)",
            fontsize=13, weight="bold", va="top")

    # -- planning cycle -------------------------------------------------------------------------
    y, h, w = 6.35, 2.35, 2.15
    xs = [0.2, 2.6, 5.0, 7.4, 9.8, 12.2, 14.6]
    box(ax, xs[0], y, w, h, "Clip / sensors",
        "logged clip (NGSIM, AV2,\nWOMD, CommonRoad,\nLanelet2, SUMO) or live\nobjects + odometry + map",
        "rad2_datasets", "data")
    box(ax, xs[1], y, w, h, "BEV + scene tokens",
        "11×128×128 raster\nmap / agent / route\ntokens, ego state,\nvalidators",
        "rad2_core", "data")
    box(ax, xs[2], y, w, h, "Generator",
        "scene encoder +\nDiT diffusion,\nK = 4 steps →\nM = 32 candidates",
        "rad2_planner", "planner")
    box(ax, xs[3], y, w, h, "Discriminator",
        "scores candidates;\nargmax over the safe\nset + κ·consensus prior\n(rule fallback: safe_medoid)",
        "rad2_planner", "planner")
    box(ax, xs[4], y, w, h, "Post-planning",
        "stall recovery → plan\nbraking → traffic rules\n→ safety envelope →\n"
        "comfort limits →\ndrivable area (+ critic)",
        "rad2_planner", "planner")
    box(ax, xs[5], y, w, h, "iLQR tracker",
        "kinematic bicycle,\n4 s horizon, 30 Hz,\nminimal-risk stop\non stale input",
        "rad2_control", "control")
    box(ax, xs[6], y, w, h, "Vehicle / simulator",
        "control command to the\nvehicle, or BEV-Warp:\nlogged BEV warped into\nthe simulated ego frame",
        "bev_warp_sim", "sim")
    for i in range(len(xs) - 1):
        arrow(ax, (xs[i] + w, y + h / 2), (xs[i + 1], y + h / 2))
    # closed loop: the simulator's next state feeds the next observation
    arrow(ax, (xs[6] + w / 2, y + h), (xs[0] + w / 2, y + h), "next state (closed loop, 10 Hz)",
          rad=0.1, colour="#7f3f5f", offset=(0.0, 0.74))

    # -- training loop --------------------------------------------------------------------------
    ty, th, tw = 3.15, 2.2, 2.5
    tx = [0.2, 3.45, 6.7, 9.95, 13.2]
    box(ax, tx[0], ty, tw, th, "Imitation learning",
        "generator from logged\ndrives + pose-perturbed\nrecovery; collision critic,\nself-correction",
        "rad2_training", "training")
    box(ax, tx[1], ty, tw, th, "Rollouts",
        "G rollouts per clip in\nBEV-Warp, sampled\ncandidate, latched\nH_reuse steps; Ray workers",
        "bev_warp_sim / rad2_training", "sim")
    box(ax, tx[2], ty, tw, th, "Rewards",
        "collision (TTC) +\nefficiency (progress\nratio); other rewards\nby name",
        "bev_warp_sim", "sim")
    box(ax, tx[3], ty, tw, th, "TC-GRPO",
        "group advantages,\nclipped ratio, entropy\nterm → discriminator",
        "rad2_training", "training")
    box(ax, tx[4], ty, tw, th, "OGO",
        "re-timed targets (slower\nnear hazards, faster\nwhen lagging) → generator\n"
        "(not in the shipped\nplanner)",
        "rad2_training", "training")
    for i, lab in enumerate(["IL planner", "traces", "rewards", "every 8\nrounds"]):
        arrow(ax, (tx[i] + tw, ty + th / 2), (tx[i + 1], ty + th / 2), lab, offset=(0.0, 0.06))
    # updated weights go back into the planner
    arrow(ax, (tx[3] + tw / 2, ty + th), (xs[3] + w / 2, y), "trained discriminator", colour="#8a6d00",
          offset=(0.55, -0.1))
    arrow(ax, (tx[4] + tw / 2, ty + th), (xs[2] + w * 0.75, y), "fine-tuned generator", rad=0.08,
          colour="#8a6d00", offset=(1.6, 0.15))
    arrow(ax, (tx[0] + tw * 0.7, ty + th), (xs[2] + w * 0.25, y), "pretrained generator", rad=-0.1,
          colour="#8a6d00", offset=(-0.9, 0.05))

    # -- ROS 2 layer ----------------------------------------------------------------------------
    ry, rh = 0.25, 2.45
    ax.add_patch(FancyBboxPatch((0.2, ry), 16.55, rh, boxstyle="round,pad=0.02,rounding_size=0.08",
                                fc=COLOURS["ros"], ec="#444444", lw=1.2))
    ax.text(0.45, ry + rh - 0.15, "ROS 2 layer and tools", fontsize=10.5, weight="bold", va="top")
    ros_lines = [
        ("rad2_msgs", "BevFeatures, SceneTokens, CandidateSet, Trajectory, ControlCommand, "
                      "PlanningDiagnostics, …"),
        ("rad2_ros", "perception_node → planner_node → controller_node; sim_node; "
                     "supervisor_node (heartbeats)"),
        ("rad2_bringup", "launch files + launch/graphs.yaml (vehicle, simulation, replay); params, "
                         "checkpoints; the rad2 command"),
        ("rad2_evaluation", "closed-loop evaluation, experiments, bag replay, benchmarks"),
    ]
    for i, (pkg, text) in enumerate(ros_lines):
        yy = ry + rh - 0.65 - i * 0.38
        ax.text(0.5, yy, pkg, fontsize=8.6, family="monospace", weight="bold", va="center")
        ax.text(2.55, yy, text, fontsize=8.6, va="center")
    ax.text(0.5, ry + 0.2,
            "dependencies point one way:  rad2_core ← rad2_datasets, rad2_control, rad2_planner"
            " ← bev_warp_sim ← rad2_training ← rad2_evaluation;   rad2_msgs, rad2_ros ← rad2_bringup",
            fontsize=8.4, style="italic", va="bottom", color="#333333")

    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "architecture.png")
    draw(ap.parse_args().out)


if __name__ == "__main__":
    main()
