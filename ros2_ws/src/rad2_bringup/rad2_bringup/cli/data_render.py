#!/usr/bin/env python3
"""Render a clip (a dataset clip, a clip .npz, an AV2 scenario or sensor log, a CommonRoad XML or a WOMD
TFRecord's first scenario) to PNG (one frame: world view + BEV channels) and/or GIF (the whole clip).

  render_clip.py data/eval_safety --clip-id <id> --step 30 --png out/frame.png
  render_clip.py tests/fixtures/av2/0a1e6f0a-1817-4a98-b02e-db8c9327d151 --gif out/av2.gif --stride 3
  render_clip.py tests/fixtures/commonroad/USA_US101-5_1_T-1.xml --png out/cr.png --step 50
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def load_any(source: Path, clip_id: str | None, index: int):
    """A clip from a dataset directory (by --clip-id or --index) or from any log of
    rad2_datasets.adapters.logs (a clip .npz, an AV2 scenario or sensor log, CommonRoad XML, WOMD)."""
    from rad2_core.storage import iter_dataset, read_index
    from rad2_datasets.adapters.logs import LogFormatError, load_log

    if source.is_dir() and (source / "index.json").is_file():
        entries = read_index(source)["clips"]
        if clip_id is not None:
            if clip_id not in {e["clip_id"] for e in entries}:
                raise SystemExit(f"--clip-id: {clip_id!r} not in {source}/index.json")
        elif not 0 <= index < len(entries):
            raise SystemExit(f"--index: {index} outside 0..{len(entries) - 1}")
        want = clip_id if clip_id is not None else entries[index]["clip_id"]
        for c in iter_dataset(source):
            if c.clip_id == want:
                return c
    try:
        return load_log(source)
    except LogFormatError as exc:
        raise SystemExit(f"source: {exc}") from None


def main(argv=None) -> int:
    from rad2_core.cli_args import float_in, int_at_least

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "source", type=Path, help="dataset dir, clip .npz, AV2 scenario dir or CommonRoad .xml"
    )
    parser.add_argument("--clip-id", help="clip to pick from a dataset directory")
    parser.add_argument("--index", type=int_at_least(0), default=0,
                        help="clip index in a dataset (default 0)")
    parser.add_argument("--step", type=int_at_least(0), default=None,
                        help="step for --png (default: middle of the clip)")
    parser.add_argument("--png", type=Path, help="write one frame here")
    parser.add_argument("--gif", type=Path, help="write the whole clip as an animated GIF here")
    parser.add_argument("--stride", type=int_at_least(1), default=2,
                        help="GIF: render every N-th step (default 2)")
    parser.add_argument("--radius", type=float_in(1.0, 10000.0), default=40.0,
                        help="world view half-width in m (default 40)")
    parser.add_argument("--no-bev", action="store_true", help="omit the BEV channel panels")
    args = parser.parse_args(argv)
    if args.png is None and args.gif is None:
        parser.error("give --png and/or --gif")
    from rad2_core.render import save_clip_gif, save_frame_png

    clip = load_any(args.source, args.clip_id, args.index)
    kw = dict(view_radius=args.radius, show_bev=not args.no_bev)
    if args.png is not None:
        step = clip.num_steps // 2 if args.step is None else args.step
        if not 0 <= step < clip.num_steps:
            parser.error(f"--step: {step} outside 0..{clip.num_steps - 1}")
        print(save_frame_png(clip, step, args.png, **kw))
    if args.gif is not None:
        print(save_clip_gif(clip, args.gif, stride=args.stride, **kw))
    return 0


if __name__ == "__main__":
    from rad2_core.cli_args import run_tool

    sys.exit(run_tool(main, "render_clip"))
