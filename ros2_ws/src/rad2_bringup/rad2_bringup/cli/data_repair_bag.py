"""Repair a rosbag2 MCAP bag whose recorder died (SIGKILL, crash, power loss).

Such a bag has an MCAP file without its summary/footer and no (or a stale) metadata.yaml, so
readers refuse it. This reads every complete record sequentially, writes a valid MCAP (with summary
and index) and a rosbag2 metadata.yaml with matching counts and time range, keeps the damaged
original beside it as <name>.damaged, and reports the messages recovered per topic and what was
lost at the end. A bag that is already complete is left untouched.
Exit status: 0 repaired or already complete, 2 not a bag / unreadable.

example:
  rad2 data repair-bag runs/live_bag          # the bag directory (or its .mcap file)
"""

from __future__ import annotations

import sys

from rad2_bringup.cli.common import verb_parser


def main(argv: list[str]) -> int:
    from rad2_datasets import bags

    parser = verb_parser("data repair-bag", __doc__)
    parser.add_argument("bag", metavar="BAG", help="rosbag2 directory (or its .mcap file) to repair")
    args = parser.parse_args(argv)
    try:
        report = bags.recover_bag(args.bag)
    except (bags.BagError, OSError) as exc:
        print(f"rad2 data repair-bag: error: {exc}", file=sys.stderr)
        return 2
    print(report.summary())
    return 0
