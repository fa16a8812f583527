"""Write clips as CommonRoad scenarios with a planning problem each, for `rad2 eval commonroad`.

Each clip's map becomes a lanelet network, its agents obstacles on their logged tracks, its ego's start
the initial state and where the logged driver was --horizon-s later the goal (a small box around it, a
time window of --goal-window-s, its heading and speed within a margin): see
rad2_datasets.commonroad_export. A clip that cannot become a problem (too short, a map without lane
boundaries) is named and skipped. A dataset's licence binds what is written as it binds the dataset.

examples:
  rad2 data to-commonroad --data out/interaction_test --out out/interaction_cr
  rad2 eval commonroad --scenarios out/interaction_cr --planners rad2 pdm_closed idm reactive \\
      --skip-bad --out runs/cr_interaction
"""

from __future__ import annotations

import sys
from pathlib import Path

from rad2_bringup.cli.common import verb_parser


def main(argv: list[str]) -> int:
    from rad2_core.cli_args import float_in, int_at_least

    ap = verb_parser("data to-commonroad", __doc__)
    ap.add_argument("--data", nargs="+", required=True, metavar="DIR",
                    help="clip dataset directories (index.json, clips/, maps/)")
    ap.add_argument("--out", type=Path, required=True, help="output directory (<out>/<dataset>/*.xml)")
    ap.add_argument("--max-clips", type=int_at_least(1), help="at most N clips per dataset (default: all)")
    ap.add_argument("--horizon-s", type=float_in(1.0, 60.0), default=8.0,
                    help="the goal is where the logged driver was this long after the start (8)")
    ap.add_argument("--goal-window-s", type=float_in(0.1, 10.0), default=1.0,
                    help="the goal's time window, ending at the horizon (1.0)")
    args = ap.parse_args(argv)
    try:
        import commonroad.common.writer.file_writer_xml  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - an older commonroad-io fails with more than ImportError
        print(f"rad2 data to-commonroad: error: commonroad-io is not usable ({type(exc).__name__}: {exc}; "
              "pip install --no-deps -r tools/requirements-commonroad.txt)", file=sys.stderr)
        return 2
    from rad2_core.storage import ClipFormatError, load_clip, read_index
    from rad2_datasets.commonroad_export import (
        CommonRoadExportError,
        ProblemShape,
        clip_problem,
        write_problem,
    )
    from tqdm import tqdm

    try:
        shape = ProblemShape(horizon_s=args.horizon_s, goal_window_s=args.goal_window_s)
    except CommonRoadExportError as exc:
        ap.error(str(exc))
    written, skipped, paths = 0, [], set()
    for data in args.data:
        ddir = Path(data)
        try:
            entries = read_index(ddir)["clips"]
        except (ClipFormatError, OSError, KeyError) as exc:
            ap.error(f"--data {data}: not a clip dataset ({exc})")
        if args.max_clips is not None and len(entries) > args.max_clips:
            step = len(entries) / args.max_clips
            entries = [entries[int(i * step)] for i in range(args.max_clips)]
        for entry in tqdm(entries, desc=ddir.name, unit="clip"):
            try:
                clip = load_clip(ddir / entry["file"], maps_dir=ddir / "maps")
                scenario, pset, notes = clip_problem(clip, shape)
            except (ClipFormatError, CommonRoadExportError, ValueError, KeyError, AssertionError) as exc:
                # commonroad-io refuses a lanelet it cannot take with an AssertionError
                skipped.append(f"{ddir.name}/{entry.get('clip_id', entry.get('file'))}: "
                               f"{type(exc).__name__}: {exc}")
                continue
            path = args.out / ddir.name / f"{scenario.scenario_id}.xml"
            if path in paths:  # two clip ids alike once shortened to a scenario name: keep both
                path = path.with_name(f"{path.stem}_{len(paths)}.xml")
            paths.add(path)
            source = str(clip.metadata.get("source", ddir.name))
            try:
                write_problem(scenario, pset, path, source=source)
            except OSError as exc:
                print(f"rad2 data to-commonroad: error: --out: cannot write {path} ({exc}); "
                      f"{written} scenario(s) written before it stay", file=sys.stderr)
                return 2
            written += 1
            skipped += [f"{ddir.name}/{clip.clip_id}: {n}" for n in notes]
    for line in skipped:
        print(f"  {line}")
    tail = f"; {len(skipped)} note(s) above" if skipped else ""
    print(f"wrote {written} scenario(s) under {args.out}{tail}")
    return 0 if written else 2
