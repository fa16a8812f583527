#!/usr/bin/env python3
"""Convert Waymo Open Motion Dataset scenario TFRecords into a rad2 clip dataset (no TensorFlow needed).

Examples:
  tools/convert_womd.py ~/womd/validation/validation.tfrecord-00000-of-00150 --out out/womd_val
  tools/convert_womd.py ~/womd/validation --out out/womd_val --limit 200 --skip-bad
  tools/convert_womd.py shard.tfrecord --out out/womd --append

Each Scenario record becomes one clip (the SDC is the ego) at the simulator's step (params/sim.yaml
sim.dt); conversion parameters are params/bev.yaml adapters.* (see adapters/womd.py). Record CRCs are
checked unless --no-verify-crc. Output: index.json, clips/<clip_id>.npz, maps/<map_id>.npz.
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
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "inputs",
        nargs="+",
        type=Path,
        help="TFRecord files of waymo.open_dataset.Scenario, or directories of *.tfrecord* files",
    )
    ap.add_argument("--out", type=Path, required=True, help="output dataset directory")
    ap.add_argument("--limit", type=_positive_int, help="convert at most this many records")
    ap.add_argument(
        "--append",
        action="store_true",
        help="add to an existing dataset (same clip_id replaced) instead of starting a new index",
    )
    ap.add_argument(
        "--skip-bad",
        action="store_true",
        help="skip records that do not convert (reported at the end) instead of stopping",
    )
    ap.add_argument(
        "--no-verify-crc",
        action="store_true",
        help="do not check the TFRecord CRCs (faster; corruption then shows as decode errors)",
    )
    ap.add_argument("--params", type=Path, help="a bev.yaml to use instead of params/bev.yaml")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    return ap


def main(argv=None) -> int:
    ap = _parser()
    args = ap.parse_args(argv)

    from rad2_planner.adapters.womd import WOMDFormatError, convert_to_dataset
    from rad2_planner.config import ParameterError, load_params

    start = time.perf_counter()
    try:
        params = load_params(args.params if args.params else "bev")
        converted, index, errors = convert_to_dataset(
            args.inputs, args.out, params, limit=args.limit, append=args.append, skip_bad=args.skip_bad,
            verify_crc=not args.no_verify_crc, progress=not args.no_progress)
    except (ParameterError, WOMDFormatError, OSError) as exc:
        print(f"convert_womd: {exc}", file=sys.stderr)
        return 1
    print(
        f"convert_womd: {converted} clips written to {args.out} ({index['num_clips']} in the index) in "
        f"{time.perf_counter() - start:.1f} s"
    )
    for msg in errors:
        print(f"  skipped: {msg}", file=sys.stderr)
    return 0

if __name__ == "__main__":
    sys.exit(main())
