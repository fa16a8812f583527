"""Bring up a rad2 ROS 2 graph without `ros2 launch`: the same executables, node names and parameter
files as launch/*.launch.py, all read from launch/graphs.yaml.

Two modes:
  processes (default)  one OS process per node (install/<pkg>/lib/<pkg>/<exe> --ros-args ...), each
                       with its own log file; a readiness check waits until every node is visible in
                       the ROS graph with its publishers/subscriptions; SIGINT, then SIGTERM, then
                       SIGKILL on shutdown.
  --composed           every node of the graph in this one process on a MultiThreadedExecutor.

examples:
  rad2 graph up simulation --arg dataset=data/eval_safety --arg num_clips=2
  rad2 graph up vehicle --set planner.deadline_ms=80 --duration 30
  rad2 graph up simulation --composed --domain-id 42
  rad2 graph up --list
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from rad2_core.config import ParameterError, parse_node_overrides

from rad2_bringup import graphs
from rad2_bringup.bringup import Bringup, BringupError, run_composed
from rad2_bringup.cli.common import verb_parser


# -- CLI -------------------------------------------------------------------------------------------
def _parse_kv(items: list[str], what: str) -> list[tuple[str, str]]:
    out = []
    for item in items:
        if "=" not in item:
            raise SystemExit(f"rad2 graph up: error: {what} {item!r} is not KEY=VALUE")
        k, v = item.split("=", 1)
        out.append((k.strip(), v))
    return out


def _parser() -> argparse.ArgumentParser:
    from rad2_core.cli_args import float_in, int_at_least

    ap = verb_parser("graph up", __doc__)
    ap.add_argument("graph", nargs="?", help="graph name from launch/graphs.yaml")
    ap.add_argument("--list", action="store_true", help="list graphs, their nodes and arguments")
    ap.add_argument("--print", action="store_true", help="print the commands and exit")
    ap.add_argument("--arg", action="append", default=[], metavar="NAME=VALUE", help="graph argument")
    ap.add_argument("--set", action="append", default=[], metavar="NODE.PARAM=VALUE",
                    help="parameter override for one node (after the parameter files)")
    ap.add_argument("--only", action="append", default=None, metavar="NODE",
                    help="start only these nodes (repeatable), e.g. for a two-host split")
    ap.add_argument("--composed", action="store_true", help="all nodes in one process (executor)")
    ap.add_argument("--foreground", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--domain-id", type=int_at_least(0, 232),
                    default=int(os.environ.get("ROS_DOMAIN_ID", "0")),
                    help="ROS_DOMAIN_ID (default: $ROS_DOMAIN_ID or 0)")
    ap.add_argument("--log-dir", type=Path, default=None, help="per-process logs (default runs/bringup/...)")
    ap.add_argument("--duration", type=float_in(0.0, 86400.0, exclusive_min=True), default=None,
                    help="stop after this many seconds")
    ap.add_argument("--ready-timeout", type=float_in(0.0, 3600.0, exclusive_min=True), default=60.0,
                    help="seconds to wait for readiness")
    return ap


def main(argv: list[str]) -> int:
    ap = _parser()
    ns = ap.parse_args(argv)

    if ns.list:
        print(graphs.describe_graphs())
        return 0
    if not ns.graph:
        ap.error("a graph name is required (see --list)")
    args = dict(_parse_kv(ns.arg, "--arg"))
    try:
        overrides = parse_node_overrides(ns.set)
    except ParameterError as exc:
        raise SystemExit(f"rad2 graph up: error: {exc}") from None
    if ns.composed and ns.foreground:
        return run_composed(ns.graph, args, overrides, ns.domain_id, ns.duration, ns.only)

    try:
        bringup = Bringup(ns.graph, args, ns.domain_id, ns.log_dir, overrides, composed=ns.composed,
                          only=ns.only)
    except (graphs.GraphError, BringupError) as exc:
        print(f"rad2 graph up: error: {exc}", file=sys.stderr)
        return 2
    if ns.print:
        for p in bringup.processes:
            print(" ".join(p.command))
        return 0
    return bringup.run(ns.ready_timeout, ns.duration)

