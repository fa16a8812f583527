"""ROS 2 graph smoke check: two processes exchange every rad2_msgs message type over Fast DDS.

Default (orchestrator): starts an `echo` process (subscribes to /rad2_smoke/request/<Type> and
republishes each message on /rad2_smoke/reply/<Type>) and a `probe` process (publishes realistic
content built with rad2_ros.conversions, waits for each echo, checks that the content came
back unchanged by decoding it again, and measures the round-trip time), then prints one line per
message type: serialized size, round-trip latency (median / p95 / max) and whether the content
round-tripped. Exit code 0 only when every type round-tripped.

The content, its encoding/decoding and the result line are rad2_ros.msg_roundtrip (shared with the
tests, which compare what the probe received with the same content); the roles are
rad2_bringup.smoke, the child processes rad2_ros.rosenv's RosProcess. Run it in the ROS environment
(source tools/env.sh; make demo does).

examples:
  rad2 graph smoke
  rad2 graph smoke --count 50 --bev-size 256
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rad2_bringup.cli.common import verb_parser


def _parser() -> argparse.ArgumentParser:
    from rad2_core.cli_args import float_in, int_at_least

    parser = verb_parser("graph smoke", __doc__)
    parser.add_argument(
        "role",
        nargs="?",
        choices=("run", "echo", "probe"),
        default="run",
        help="run (default): start echo + probe and print the table; echo/probe: one side",
    )
    parser.add_argument(
        "--count", type=int_at_least(1, 100000), default=20,
        help="timed round trips per message type (default 20)"
    )
    parser.add_argument("--seed", type=int_at_least(0, 2**32 - 1), default=0, help="content seed (default 0)")
    parser.add_argument(
        "--bev-channels", type=int_at_least(1, 256), default=None,
        help="BEV channel count (default: params/bev.yaml)"
    )
    parser.add_argument(
        "--bev-size", type=int_at_least(8, 1024), default=None,
        help="square BEV grid size (default: params/bev.yaml)"
    )
    parser.add_argument(
        "--timeout", type=float_in(0.0, 3600.0, exclusive_min=True), default=60.0,
        help="overall seconds for the exchange (default 60)"
    )
    parser.add_argument(
        "--domain-id", type=int_at_least(0, 232), default=None,
        help="ROS_DOMAIN_ID (default: derived from the pid)"
    )
    parser.add_argument(
        "--dump", type=Path, default=None, help="probe: write the decoded replies to this .npz"
    )
    return parser


def main(argv: list[str]) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    from rad2_bringup.smoke import run_echo, run_orchestrator, run_probe

    if args.role == "echo":
        return run_echo(args.timeout)
    if args.role == "probe":
        return run_probe(args.seed, args.count, args.timeout, args.bev_channels, args.bev_size, args.dump)
    return run_orchestrator(args.count, args.seed, args.timeout, args.bev_channels, args.bev_size,
                            args.domain_id)

