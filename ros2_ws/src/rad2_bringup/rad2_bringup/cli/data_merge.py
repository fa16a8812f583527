"""Merge clip datasets into one new directory (index.json, clips/, maps/), e.g. to train on two sets at once.

Clips are loaded and validated one by one and written with each map once. Clip ids must be unique
across the inputs: a repeated id is refused, naming both datasets, since replacing one clip by another
of the same name would silently change the training set. The merge is written to ``<out>.partial`` and
renamed only when every clip loaded and validated, so a bad clip (named in the error, exit 1) leaves no
half-merged dataset behind; the inputs are only read (rad2_datasets.datasets.merge_datasets).

example (the training set of the rich-scene fine-tune):
  rad2 data merge out/train_large out/train_rich --out out/train_large_rich
"""

from __future__ import annotations

import sys
from pathlib import Path

from rad2_bringup.cli.common import verb_parser


def main(argv: list[str]) -> int:
    ap = verb_parser("data merge", __doc__)
    ap.add_argument("inputs", nargs="+", type=Path, help="dataset directories to merge, in order")
    ap.add_argument("--out", type=Path, required=True, help="new dataset directory (must not exist)")
    args = ap.parse_args(argv)
    if args.out.exists():
        ap.error(f"--out: {args.out} exists; merge into a new directory")
    for directory in args.inputs:
        if not (directory / "index.json").is_file():
            ap.error(f"inputs: {directory} is not a dataset (no index.json)")
    from rad2_datasets.datasets import MergeClipError, MergeError, merge_datasets

    try:
        clips = merge_datasets(args.inputs, args.out)
    except MergeError as exc:
        ap.error(str(exc))
    except MergeClipError as exc:
        print(f"rad2 data merge: error: {exc}; nothing was written to {args.out}", file=sys.stderr)
        return 1
    print(f"{args.out}: {clips} clips from {len(args.inputs)} datasets")
    return 0
