"""Convert real driving logs (Argoverse 2 scenarios and sensor logs, CommonRoad XML, Waymo Open Motion
TFRecords, INTERACTION track files, or clips of this project) into one rad2 clip dataset, and print what
it holds.

Inputs are files or directories, searched recursively; the format of each log is recognised from what
is on disk (see rad2_datasets/adapters/logs.py); --format keeps only logs of the formats named. Every
clip is at the simulator's step (params/sim.yaml sim.dt); conversion parameters are params/bev.yaml
adapters.*. CommonRoad scenes recorded without an ego (NGSIM) give one clip per promoted ego: moving
vehicles of passenger-car size, best first (adapters.promoted_ego). Waymo Open Motion (WOMD) needs no
TensorFlow: each Scenario record becomes one clip with the SDC as the ego (adapters/womd.py), and the
record CRCs are checked unless --no-verify-crc. INTERACTION track files (vehicle_tracks_NNN.csv, with the
location's map <root>/maps/<location>.osm) give one clip per promoted ego, each a window of its track
(adapters/interaction.py). Output: index.json, clips/<clip_id>.npz, maps/<map_id>.npz.

examples:
  rad2 data convert ~/av2/motion-forecasting/val --out out/av2_val --limit 200 --skip-bad
  rad2 data convert ~/commonroad/scenarios --out out/ngsim --egos-per-scenario 5
  rad2 data convert tests/fixtures/av2 tests/fixtures/commonroad --out out/real_fixtures
  rad2 data convert ~/womd/validation --format womd --out out/womd_val --limit 200 --skip-bad
  rad2 data convert shard.tfrecord --format womd --out out/womd --append
  rad2 data convert ~/interaction --format interaction --out out/interaction --egos-per-scenario 10
  rad2 eval policy --policy rad2 idm --split out/real_fixtures --out runs/real
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from rad2_bringup.cli.common import verb_parser


def _parser() -> argparse.ArgumentParser:
    from rad2_core.cli_args import int_at_least
    from rad2_datasets.adapters.logs import FORMATS

    ap = verb_parser("data convert", __doc__)
    ap.add_argument("inputs", nargs="+", type=Path, help="log files or directories (searched recursively)")
    ap.add_argument("--out", type=Path, required=True, help="output dataset directory")
    ap.add_argument("--format", nargs="+", choices=FORMATS, dest="formats",
                    help="convert only logs of these formats (default: every format found)")
    ap.add_argument("--egos-per-scenario", type=int_at_least(1), default=1,
                    help="CommonRoad scenes and INTERACTION track files (no recorded ego): clips per scene "
                         "or file, one per promoted ego (default 1)")
    ap.add_argument("--limit", type=int_at_least(1), help="write at most this many clips")
    ap.add_argument("--append", action="store_true",
                    help="add to an existing dataset (same clip_id replaced) instead of starting a new index")
    ap.add_argument("--skip-bad", action="store_true",
                    help="skip logs that do not convert (reported at the end) instead of stopping")
    ap.add_argument("--no-verify-crc", action="store_true",
                    help="WOMD: do not check the TFRecord CRCs (faster; corruption shows as decode errors)")
    ap.add_argument("--params", type=Path, help="a bev.yaml to use instead of params/bev.yaml")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    return ap


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)

    from rad2_core.config import ParameterError, load_all, load_params, merged
    from rad2_core.field_checks import ClipValidationError
    from rad2_datasets.adapters.logs import LogFormatError, convert_logs
    from rad2_datasets.datasets import composition
    from rich.console import Console
    from rich.table import Table

    start = time.perf_counter()
    try:
        params = load_all(("sim", "validators"))
        params["bev"] = load_params(args.params if args.params else "bev")
        params = merged(params, "bev", "sim", "validators")
        written, index, errors = convert_logs(
            args.inputs, args.out, params, formats=args.formats, egos_per_scenario=args.egos_per_scenario,
            limit=args.limit, append=args.append, skip_bad=args.skip_bad, verify_crc=not args.no_verify_crc,
            progress=not args.no_progress)
    except (ParameterError, LogFormatError, ClipValidationError, OSError) as exc:
        print(f"rad2 data convert: error: {exc}", file=sys.stderr)
        return 1
    if errors:
        print(f"rad2 data convert: skipped {len(errors)} that did not convert:", file=sys.stderr)
        for e in errors:
            print(f"  {e}", file=sys.stderr)
    if written == 0:
        inputs = ", ".join(str(p) for p in args.inputs)
        print(f"rad2 data convert: error: no clip converted from {inputs}", file=sys.stderr)
        return 1
    table = Table(title=f"{args.out}: {index['num_clips']} clips")
    rows = composition(args.out)
    for key in rows[0] if rows else ():
        table.add_column(key, justify="left" if key == "source" else "right")
    for r in rows:
        table.add_row(*(f"{v:.1f}" if isinstance(v, float) else str(v) for v in r.values()))
    Console().print(table)
    print(f"rad2 data convert: {written} clips written to {args.out} ({index['num_clips']} in the index) in "
          f"{time.perf_counter() - start:.1f} s")
    return 0
