"""The CommonRoad benchmark: planners on the planning problems of CommonRoad scenarios, each drive
written as a CommonRoad solution and judged by the official solution checker (commonroad-drivability-
checker) and its cost function, independently of rad2's own metrics.

For each planning problem the ego starts at the problem's initial state; the scenario's vehicles stay
obstacles on their recorded trajectories (--reactive-agents: the simulator's IDM agents along their
paths instead; the judge still checks against the recorded ones). The route to the goal comes from
commonroad-route-planner. rad2, PDM-Closed and IDM drive in the BEV-Warp simulator (planner, iLQR,
kinematic bicycle) until the goal region is reached, the time window ends or the simulator ends the
episode; commonroad-reactive-planner (default configuration) drives in its own replanning loop. The
simulated ego is the judged car (BMW_320i's box; --ego-box rad2: params/vehicle.yaml's), and rad2's own
off-road verdict is the judge's rule (the whole box on the road, no margin). rad2 takes the goal's time
window as its mission speed (the pace that reaches the goal region's centre at the window's middle,
params/planner.yaml mission_pace); the reactive planner takes the goal's speed as its desired speed.

Writes <out>/solutions/<planner>/<scenario>_<problem>.xml (CommonRoad solutions: KS model, BMW_320i,
cost function from the benchmark ID or SM1), <out>/drives.jsonl (one line per drive, as it finishes:
the judge's verdicts, rad2's own verdicts and where they differ, planning times), <out>/results.json,
<out>/table.md and GIFs of rad2's unsolved problems (<out>/gifs). Scenarios: folders of XML files, XML
files, or split lists (data/splits/ngsim_test.txt; paths relative to --corpus-root).

Bad input (unreadable XML, no planning problem, a goal region off the map, no route, an initial state
across the road boundary or inside an obstacle, the recorded ego kept as an obstacle at the initial
state) is named; the run stops before driving (exit 2) unless --skip-bad.

examples:
  rad2 eval commonroad --scenarios tests/fixtures/commonroad --planners rad2 idm --out runs/cr_fixture
  rad2 eval commonroad --scenarios data/splits/ngsim_test.txt --corpus-root /work/shared/data/ngsim \\
      --planners rad2 rad2@checkpoints/rad2_rl_real pdm_closed idm reactive --out runs/cr_test --skip-bad
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
from pathlib import Path

from rad2_bringup.cli.common import verb_parser


def _parser() -> argparse.ArgumentParser:
    from rad2_core.cli_args import int_at_least

    ap = verb_parser("eval commonroad", __doc__)
    ap.add_argument("--scenarios", nargs="+", required=True,
                    help="folders of CommonRoad XML files (subfolders too), XML files or split lists (.txt)")
    ap.add_argument("--corpus-root", default=None,
                    help="folder the paths of a split list are relative to (default: the list's folder)")
    ap.add_argument("--planners", nargs="+", default=["rad2", "pdm_closed", "idm", "reactive"],
                    help="rad2 | rad2@CHECKPOINT_DIR | pdm_closed | idm | reactive (default: rad2 pdm_closed "
                         "idm reactive)")
    ap.add_argument("--checkpoint", default=None,
                    help="checkpoint directory of the rad2 planner (default: params/planner.yaml's)")
    ap.add_argument("--out", default="runs/commonroad", help="output directory (default %(default)s)")
    ap.add_argument("--reactive-agents", action="store_true",
                    help="the simulator's reactive agents (IDM along their recorded paths) instead of replay")
    ap.add_argument("--ego-box", choices=("rad2", "benchmark"), default="benchmark",
                    help="the simulated ego's box: the benchmark vehicle's (BMW_320i, 4.508 x 1.61 m: the "
                         "car the judge checks, default) or params/vehicle.yaml's (rad2, 4.8 x 1.9 m)")
    ap.add_argument("--skip-bad", action="store_true",
                    help="name the bad inputs and go on without them (default: name them and stop, exit 2)")
    ap.add_argument("--limit", type=int_at_least(1), default=None,
                    help="benchmark only the first N planning problems (after bad ones are left out)")
    ap.add_argument("--gifs", type=int_at_least(0), default=20,
                    help="GIFs of rad2's unsolved drives, the first planner's first (default 20)")
    ap.add_argument("--seed", type=int_at_least(0), default=0, help="the learned planner's seed (default 0)")
    ap.add_argument("--resume", action="store_true",
                    help="read the drives already in <out>/drives.jsonl back instead of driving them again")
    ap.add_argument("--no-progress", action="store_true", help="hide progress bars")
    return ap


def main(argv: list[str]) -> int:
    ap = _parser()
    args = ap.parse_args(argv)
    # before anything imports protobuf: commonroad-io 2024's generated modules need its Python
    # implementation under rad2's protobuf 7 (rad2_evaluation.commonroad_benchmark)
    from rad2_evaluation import commonroad_benchmark as cb

    cb.use_python_protobuf()
    try:
        import commonroad_dc  # noqa: F401
        import commonroad_route_planner  # noqa: F401
    except ImportError as exc:
        print(f"rad2 eval commonroad: error: {exc.name} is not installed (pip install --no-deps -r "
              "tools/requirements-commonroad.txt)", file=sys.stderr)
        return 2
    try:
        specs = cb.parse_planners(args.planners, args.checkpoint)
        files_in = cb.scenario_files(args.scenarios, args.corpus_root)
    except (ValueError, FileNotFoundError) as exc:
        ap.error(str(exc))
    if not files_in:
        ap.error("--scenarios: no CommonRoad XML file found")
    from rad2_core.config import ResourceNotFoundError, load_all, merged
    from rich.console import Console

    console = Console(width=max(Console().width, 180))
    files = load_all()
    # no logged ego exists: every observation is rendered at the simulated pose
    files["sim"]["sim"]["warp_max_uncovered"] = 0.0
    # rad2's own off-road verdict by the judge's rule: the whole box on the road, no tolerance
    files["sim"]["sim"]["offroad_check"], files["sim"]["sim"]["offroad_margin_m"] = "box", 0.0
    if args.reactive_agents:
        files["sim"]["sim"]["reactive_agents"] = True
    if args.ego_box == "benchmark":  # the whole stack (simulator, planners, checks) sees the judge's box
        vp = cb.vehicle_parameters()
        files["vehicle"]["vehicle"]["length"], files["vehicle"]["vehicle"]["width"] = float(vp.l), float(vp.w)
    params = merged(files, *files)
    problems = cb.load_problems(files_in, params, progress=not args.no_progress)
    bad = [p for p in problems if p.bad]
    if bad:
        console.print(f"[yellow]{len(bad)} bad input(s):[/]")
        for p in bad:
            console.print(f"  {p.describe()}", markup=False)
        if not args.skip_bad:
            print(f"rad2 eval commonroad: error: {len(bad)} bad input(s) (listed above; --skip-bad goes on "
                  "without them)", file=sys.stderr)
            return 2
    ready = [p for p in problems if not p.bad]
    if args.limit is not None:
        keep = {p.key for p in ready[: args.limit]}
        problems = [p for p in problems if p.bad or p.key in keep]
    if not any(not p.bad for p in problems):
        print("rad2 eval commonroad: error: no planning problem left to drive", file=sys.stderr)
        return 2
    out = Path(args.out)
    from rad2_planner.networks.model import CheckpointError

    try:
        records = cb.run_benchmark(problems, specs, files, out, reactive_agents=args.reactive_agents,
                                   seed=args.seed, progress=not args.no_progress, log=console.print,
                                   resume=args.resume)
    except (CheckpointError, ResourceNotFoundError) as exc:
        ap.error(f"--checkpoint: {exc}")
    rows = cb.summary(records)
    mode = "reactive agents" if args.reactive_agents else "recorded obstacles"
    mode += f", {args.ego_box} ego box"
    title = f"CommonRoad benchmark ({len(records)} drives, {mode}; judged by commonroad-drivability-checker)"
    note = cb.bad_note(problems)
    console.print(cb.rich_table(rows, title))
    if note:
        console.print(note, markup=False)
    disagreements = [(r["planner"], r["scenario"], d) for r in records for d in r["disagreements"]]
    for planner, scenario, d in disagreements:
        console.print(f"  {planner} @ {scenario}: {d}", markup=False)
    meta = {"date": datetime.date.today().isoformat(), "machine": f"{platform.node()} ({platform.machine()}, "
            f"{platform.processor() or 'cpu'})", "command": "rad2 eval commonroad " + " ".join(argv),
            "vehicle_type": cb.VEHICLE_TYPE_NAME, "mode": mode, "ego_box": args.ego_box}
    (out / "table.md").write_text(cb.markdown_table(rows) + "\n" + (f"\n{note}\n" if note else ""))
    (out / "results.json").write_text(json.dumps(
        {"meta": meta, "summary": rows, "bad": [{"path": p.path, "problem_id": p.problem_id, "reason": p.bad}
                                                for p in problems if p.bad],
         "drives": records}, indent=1, default=cb._jsonable))
    gifs = _gifs(problems, records, params, out / "gifs", args.gifs)
    console.print(f"wrote {out / 'results.json'}, {out / 'table.md'}, {len(records)} solutions under "
                  f"{out / 'solutions'} and {len(gifs)} GIFs under {out / 'gifs'}")
    return 0


def _gifs(problems, records, params, folder: Path, n: int) -> list[Path]:
    """GIFs of the first ``n`` drives of rad2 planners the judge did not count as solved."""
    from rad2_evaluation import commonroad_benchmark as cb

    tracks = getattr(cb.run_benchmark, "tracks", {})
    by_key = {p.key: p for p in problems if not p.bad}
    failed = [r for r in records if r["planner"].startswith("rad2") and not r["judge"]["solved"]
              and (r["planner"], f"{r['scenario']}:{r['problem_id']}") in tracks]
    out = []
    for r in failed[:n]:
        key = f"{r['scenario']}:{r['problem_id']}"
        safe = "".join(ch if ch.isalnum() or ch in "_-." else "_" for ch in r["planner"])
        out.append(cb.render_failure_gif(by_key[key], r, tracks[(r["planner"], key)],
                                         folder / f"{safe}_{r['scenario']}_{r['problem_id']}.gif", params))
    return out
