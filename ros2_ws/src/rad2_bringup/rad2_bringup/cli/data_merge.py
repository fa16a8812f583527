#!/usr/bin/env python3
"""Merge clip datasets into one directory (index.json, clips/, maps/), e.g. to train on two sets at once.

Example (the training set of the rich-scene fine-tune in the README):
    .venv/bin/python tools/merge_datasets.py out/train_large out/train_rich --out out/train_large_rich

Clips are loaded and validated one by one and written with ``rad2_core.storage.save_dataset`` (each map
once). Clip ids must be unique across the inputs: a repeated id is refused, naming both datasets, since
replacing one clip by another of the same name would silently change the training set. The merge is
written to ``<out>.partial`` and renamed only when every clip loaded and validated, so a bad clip (named
in the error, exit 1) leaves no half-merged dataset behind; the inputs are only read.
"""
from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from rad2_core.storage import load_clip, read_index, save_dataset


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
    partial = args.out.with_name(args.out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)  # left by an interrupted earlier merge
    current = ""

    def clips_of(directory: Path):
        nonlocal current
        maps: dict = {}
        for entry in read_index(directory)["clips"]:
            current = str(directory / entry["file"])
            yield load_clip(directory / entry["file"], maps_dir=directory / "maps", map_cache=maps)

    try:
        for i, directory in enumerate(args.inputs):
            save_dataset(clips_of(directory), partial, append=i > 0, progress=True,
                         description=f"merged from {[str(d) for d in args.inputs]}")
    except (OSError, ValueError, KeyError) as exc:
        shutil.rmtree(partial, ignore_errors=True)
        print(f"merge_datasets: clip {current}: {exc}; nothing was written to {args.out}", file=sys.stderr)
        return 1
    partial.rename(args.out)
    print(f"{args.out}: {len(seen)} clips from {len(args.inputs)} datasets")
    return 0


if __name__ == "__main__":
    from rad2_core.cli_args import run_tool

    sys.exit(run_tool(main, "merge_datasets"))
