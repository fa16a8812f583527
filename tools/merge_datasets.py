#!/usr/bin/env python3
"""Merge clip datasets into one directory (index.json, clips/, maps/), e.g. to train on two sets at once.

Example (the training set of the rich-scene fine-tune in the README):
    .venv/bin/python tools/merge_datasets.py out/train_large out/train_rich --out out/train_large_rich

Clips are loaded and validated one by one and written with ``rad2_planner.clip.save_dataset`` (each map
once). Clip ids must be unique across the inputs: a repeated id is refused, naming both datasets, since
replacing one clip by another of the same name would silently change the training set.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rad2_planner.clip import iter_dataset, read_index, save_dataset


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("inputs", nargs="+", type=Path, help="dataset directories to merge, in order")
    ap.add_argument("--out", type=Path, required=True, help="new dataset directory (must not exist)")
    args = ap.parse_args(argv)
    if args.out.exists():
        ap.error(f"--out: {args.out} exists; merge into a new directory")
    seen: dict[str, Path] = {}
    for directory in args.inputs:
        if not (directory / "index.json").is_file():
            ap.error(f"inputs: {directory} is not a dataset (no index.json)")
        for entry in read_index(directory)["clips"]:
            if entry["clip_id"] in seen:
                ap.error(f"clip_id {entry['clip_id']!r} is in both {seen[entry['clip_id']]} and {directory}")
            seen[entry["clip_id"]] = directory
    for i, directory in enumerate(args.inputs):
        save_dataset(iter_dataset(directory), args.out, append=i > 0, progress=True,
                     description=f"merged from {[str(d) for d in args.inputs]}")
    print(f"{args.out}: {len(seen)} clips from {len(args.inputs)} datasets")
    return 0


if __name__ == "__main__":
    sys.exit(main())
