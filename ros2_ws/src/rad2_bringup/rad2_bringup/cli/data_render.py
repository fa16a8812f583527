"""Render a clip (a dataset clip, a clip .npz, an AV2 scenario or sensor log, a CommonRoad XML or a WOMD
TFRecord's first scenario) to PNG (one frame: world view + BEV channels) and/or GIF (the whole clip).

examples:
  rad2 data render data/eval_safety --clip-id <id> --step 30 --png out/frame.png
  rad2 data render tests/fixtures/av2/0a1e6f0a-1817-4a98-b02e-db8c9327d151 --gif out/av2.gif --stride 3
  rad2 data render tests/fixtures/commonroad/USA_US101-5_1_T-1.xml --png out/cr.png --step 50
"""

from __future__ import annotations

from pathlib import Path

from rad2_bringup.cli.common import verb_parser


def main(argv: list[str]) -> int:
    from rad2_core.cli_args import float_in, int_at_least

    parser = verb_parser("data render", __doc__)
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
    from rad2_core.config import load_merged
    from rad2_core.render import save_clip_gif, save_frame_png
    from rad2_datasets.adapters.logs import LogFormatError
    from rad2_datasets.datasets import ClipNotFoundError, pick_clip

    params = load_merged("bev", "sim", "validators", "vehicle")
    try:
        clip = pick_clip(args.source, params, args.clip_id, args.index)
    except ClipNotFoundError as exc:
        parser.error(f"{'--clip-id' if args.clip_id is not None else '--index'}: {exc}")
    except LogFormatError as exc:
        parser.error(f"source: {exc}")
    kw = dict(params=params, vehicle_params=params, view_radius=args.radius,
              show_bev=not args.no_bev)
    if args.png is not None:
        step = clip.num_steps // 2 if args.step is None else args.step
        if not 0 <= step < clip.num_steps:
            parser.error(f"--step: {step} outside 0..{clip.num_steps - 1}")
        print(save_frame_png(clip, step, args.png, **kw))
    if args.gif is not None:
        print(save_clip_gif(clip, args.gif, stride=args.stride, **kw))
    return 0
