#!/usr/bin/env python3
"""Convert real driving logs (Argoverse 2 scenarios and sensor logs, CommonRoad XML, Waymo Open Motion
TFRecords, or clips of this project) into one rad2 clip dataset, and print what it holds.

Examples:
  tools/convert_logs.py ~/av2/motion-forecasting/val --out out/av2_val --limit 200 --skip-bad
  tools/convert_logs.py ~/commonroad/scenarios --out out/ngsim --egos-per-scenario 5
  tools/convert_logs.py tests/fixtures/av2 tests/fixtures/commonroad --out out/real_fixtures
  tools/convert_logs.py ~/womd/validation --format womd --out out/womd_val --limit 200 --skip-bad
  tools/evaluate_policy.py --policy rad2 idm --split out/real_fixtures --out runs/real

Inputs are files or directories, searched recursively; the format of each log is recognised from what
is on disk (see rad2_datasets/adapters/logs.py). Every clip is at the simulator's step (params/sim.yaml
sim.dt); conversion parameters are params/bev.yaml adapters.*. CommonRoad scenes recorded without an
ego (NGSIM) give one clip per promoted ego: moving vehicles of passenger-car size, best first
(adapters.promoted_ego). Output: index.json, clips/<clip_id>.npz, maps/<map_id>.npz.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {v}")
    return v


def _parser() -> argparse.ArgumentParser:
    from rad2_datasets.adapters.logs import FORMATS

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("inputs", nargs="+", type=Path, help="log files or directories (searched recursively)")
    ap.add_argument("--out", type=Path, required=True, help="output dataset directory")
    ap.add_argument("--format", nargs="+", choices=FORMATS, dest="formats",
                    help="convert only logs of these formats (default: every format found)")
    ap.add_argument("--egos-per-scenario", type=_positive_int, default=1,
                    help="CommonRoad scenes without a recorded ego: clips per scene, one per promoted ego "
                         "(default 1)")
    ap.add_argument("--limit", type=_positive_int, help="write at most this many clips")
    ap.add_argument("--append", action="store_true",
                    help="add to an existing dataset (same clip_id replaced) instead of starting a new index")
    ap.add_argument("--skip-bad", action="store_true",
                    help="skip logs that do not convert (reported at the end) instead of stopping")
    ap.add_argument("--no-verify-crc", action="store_true",
                    help="WOMD: do not check the TFRecord CRCs (faster; corruption shows as decode errors)")
    ap.add_argument("--params", type=Path, help="a bev.yaml to use instead of params/bev.yaml")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    return ap


def composition(directory: Path) -> list[dict]:
    """One row per source format of the dataset: clips, seconds, ego speed, agents per step by type."""
    import numpy as np
    from rad2_core.clip import AGENT_CYCLIST, AGENT_PEDESTRIAN, AGENT_VEHICLE
    from rad2_core.storage import iter_dataset

    rows: dict[str, dict] = {}
    for clip in iter_dataset(directory):
        src = str(clip.metadata.get("source", "clip"))
        r = rows.setdefault(src, {"source": src, "clips": 0, "seconds": 0.0, "speeds": [], "agents": [],
                                  "vehicles": 0, "pedestrians": 0, "cyclists": 0, "lanes": []})
        r["clips"] += 1
        r["seconds"] += clip.duration_s
        r["speeds"].append(float(np.mean(clip.ego_speed)))
        r["agents"].append(float(clip.agent_valid.sum(axis=0).mean()) if clip.num_agents else 0.0)
        types = np.asarray(clip.agent_types)
        r["vehicles"] += int((types == AGENT_VEHICLE).sum())
        r["pedestrians"] += int((types == AGENT_PEDESTRIAN).sum())
        r["cyclists"] += int((types == AGENT_CYCLIST).sum())
        r["lanes"].append(clip.map.num_lanes)
    out = []
    for r in rows.values():
        out.append({"source": r["source"], "clips": r["clips"], "min": r["seconds"] / 60.0,
                    "ego m/s": float(np.mean(r["speeds"])), "agents/step": float(np.mean(r["agents"])),
                    "veh": r["vehicles"], "ped": r["pedestrians"], "cyc": r["cyclists"],
                    "lanes/map": float(np.mean(r["lanes"]))})
    return out


def main(argv=None) -> int:
    ap = _parser()
    args = ap.parse_args(argv)

    from rad2_core.config import ParameterError, load_params
    from rad2_core.field_checks import ClipValidationError
    from rad2_datasets.adapters.logs import LogFormatError, convert_logs
    from rich.console import Console
    from rich.table import Table

    start = time.perf_counter()
    try:
        params = load_params(args.params if args.params else "bev")
        written, index, errors = convert_logs(
            args.inputs, args.out, params, formats=args.formats, egos_per_scenario=args.egos_per_scenario,
            limit=args.limit, append=args.append, skip_bad=args.skip_bad, verify_crc=not args.no_verify_crc,
            progress=not args.no_progress)
    except (ParameterError, LogFormatError, ClipValidationError, OSError) as exc:
        print(f"convert_logs: {exc}", file=sys.stderr)
        return 1
    if errors:
        print(f"convert_logs: skipped {len(errors)} that did not convert:", file=sys.stderr)
        for e in errors:
            print(f"  {e}", file=sys.stderr)
    if written == 0:
        inputs = ", ".join(str(p) for p in args.inputs)
        print(f"convert_logs: no clip converted from {inputs}", file=sys.stderr)
        return 1
    console = Console()
    table = Table(title=f"{args.out}: {index['num_clips']} clips")
    rows = composition(args.out)
    for key in rows[0] if rows else ():
        table.add_column(key, justify="left" if key == "source" else "right")
    for r in rows:
        table.add_row(*(f"{v:.1f}" if isinstance(v, float) else str(v) for v in r.values()))
    console.print(table)
    print(f"convert_logs: {written} clips written to {args.out} ({index['num_clips']} in the index) in "
          f"{time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    from rad2_core.cli_args import run_tool

    sys.exit(run_tool(main, "convert_logs"))
