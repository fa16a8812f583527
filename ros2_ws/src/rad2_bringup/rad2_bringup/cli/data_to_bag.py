"""Convert a logged clip (rad2_core.clip) into a rosbag2 MCAP bag of perception inputs.

The bag holds, per log step, /clock, localization/odometry, perception/objects and visualisation
markers in the map frame (the topic table is in rad2_datasets.input_bags); metadata.yaml names the clip
file and id, which replay passes to the perception node.
The conversion itself is rad2_datasets.input_bags; `rad2 eval replay --bag` plays such a bag through
the real nodes.

examples:
  rad2 data to-bag --dataset data/eval_safety --index 0 --out runs/bags/clip0
  rad2 data to-bag --clip out/clip.npz --steps 0:40 --out runs/bags/short --force
"""

from __future__ import annotations

import sys

from rad2_bringup.cli.common import verb_parser


def main(argv: list[str]) -> int:
    from rad2_core.cli_args import float_in, int_at_least
    from rad2_core.storage import ClipFormatError
    from rad2_datasets import bags
    from rad2_datasets.input_bags import DEFAULT_START_TIME_S, clip_to_bag, load_clip_source, slice_steps

    parser = verb_parser("data to-bag", __doc__)
    src = parser.add_argument_group("clip (one of --clip, --dataset [--clip-id | --index])")
    src.add_argument("--dataset", help="dataset directory (index.json, clips/, maps/), e.g. data/eval_safety")
    src.add_argument("--clip-id", help="clip id inside --dataset")
    src.add_argument("--index", type=int_at_least(0), help="clip index inside --dataset (default 0)")
    src.add_argument("--clip", help="a single clip .npz (with embedded map)")
    parser.add_argument("--steps", help="only log steps START:STOP of the clip (e.g. 0:40)")
    parser.add_argument("--out", required=True, help="bag directory to create (rosbag2 layout, MCAP storage)")
    parser.add_argument("--force", action="store_true", help="replace --out if it is an existing bag")
    parser.add_argument("--start-time", type=float_in(0.0, 2.0**31 - 1.0), default=DEFAULT_START_TIME_S,
                        help="log time of step 0 in seconds since the epoch (default %(default).0f)")
    parser.add_argument("--no-viz", action="store_true", help="leave out viz/scene and viz/ego_log")
    parser.add_argument("--viz-radius", type=float_in(0.0, 100000.0, exclusive_min=True), default=120.0,
                        help="map elements within this many metres of the ego go into viz/scene")
    args = parser.parse_args(argv)
    try:
        source = load_clip_source(args.dataset, args.clip_id, args.index, args.clip)
        if args.steps:
            source.clip = slice_steps(source.clip, args.steps)
        counts = clip_to_bag(source, args.out, start_time_s=args.start_time, viz=not args.no_viz,
                             viz_radius_m=args.viz_radius, overwrite=args.force, progress=True)
    except (ValueError, ClipFormatError, bags.BagError, OSError) as exc:
        print(f"rad2 data to-bag: error: {exc}", file=sys.stderr)
        return 2
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{args.out} ({source.clip.clip_id}, {source.clip.num_steps} steps)")
    table.add_column("topic")
    table.add_column("messages", justify="right")
    for topic, n in counts.items():
        table.add_row(topic, str(n))
    Console().print(table)
    return 0
