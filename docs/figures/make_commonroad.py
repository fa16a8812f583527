"""The figure of the CommonRoad benchmark: per planner, the share of planning problems solved on each
source, and why the others failed (from the judge's verdicts and the solutions).

Usage: python docs/figures/make_commonroad.py OUT.png RESULTS.json
(``results.json`` of `rad2 eval commonroad`; the failure reasons read the scenarios and solutions its
drives name).
"""

from __future__ import annotations

import json
import sys
from collections import Counter, defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

REASONS = ("solved", "collision", "off the road", "never in the goal area", "outside the goal's window",
           "in time, speed or heading outside")


def reason(drive: dict, cache: dict) -> str:
    """Why the judge did not count ``drive`` solved (or "solved")."""
    from commonroad.common.solution import CommonRoadSolutionReader
    from rad2_datasets.adapters.commonroad import read_commonroad_file

    verdict = drive["judge"]
    if verdict["solved"]:
        return "solved"
    if not verdict["collision_free"]:
        return "collision"
    if not verdict["on_road"]:
        return "off the road"
    if drive["path"] not in cache:
        cache[drive["path"]] = read_commonroad_file(drive["path"])
    _, problems = cache[drive["path"]]
    goal = problems.planning_problem_dict[drive["problem_id"]].goal.state_list[0]
    solution = CommonRoadSolutionReader.open(drive["solution"])
    states = solution.planning_problem_solutions[0].trajectory.state_list
    inside = [s for s in states if hasattr(goal, "position") and goal.position.contains_point(s.position)]
    if not inside:
        return "never in the goal area"
    if not any(goal.time_step.contains(s.time_step) for s in inside):
        return "outside the goal's window"
    return "in time, speed or heading outside"


def main(out: str, results: str) -> None:
    data = json.load(open(results))
    drives = data["drives"]
    cache: dict = {}
    planners = list(dict.fromkeys(d["planner"] for d in drives))
    sources = sorted({d["source"] for d in drives})
    solved = defaultdict(list)
    reasons = {p: Counter() for p in planners}
    for d in drives:
        solved[(d["planner"], d["source"])].append(bool(d["judge"]["solved"]))
        reasons[d["planner"]][reason(d, cache)] += 1
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.8))
    width = 0.8 / len(planners)
    x = np.arange(len(sources))
    for k, p in enumerate(planners):
        vals = [100 * np.mean(solved[(p, s)]) if solved[(p, s)] else 0 for s in sources]
        ax1.bar(x + (k - (len(planners) - 1) / 2) * width, vals, width, label=p)
    ax1.set_xticks(x, [f"{s} ({len(solved[(planners[0], s)])})" for s in sources])
    ax1.set_ylabel("planning problems solved (%)")
    ax1.set_title("Solved, judged by commonroad-drivability-checker")
    ax1.legend(fontsize=8)
    left = np.zeros(len(planners))
    for r in REASONS:
        vals = np.array([reasons[p][r] for p in planners], float)
        ax2.barh(planners, vals, left=left, label=r)
        left += vals
    ax2.invert_yaxis()
    ax2.set_xlabel("planning problems")
    ax2.set_title("Outcome of every drive")
    ax2.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.15), ncol=3)
    fig.suptitle(f"CommonRoad benchmark, {data['meta']['date']} ({data['meta']['mode']})", fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] in ("-h", "--help"):
        print(__doc__)
        sys.exit(0 if len(sys.argv) > 1 and sys.argv[1] in ("-h", "--help") else 2)
    main(sys.argv[1], sys.argv[2])
