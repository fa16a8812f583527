"""Replay a bag of perception inputs through the real perception-features and planner nodes.

The nodes run as separate processes (graph ``replay`` of launch/graphs.yaml via rad2_bringup.bringup,
``use_sim_time`` on); this command is the player: per log step it publishes ``/clock`` (the log time),
``/localization/odometry`` and ``/perception/objects`` as the serialized bytes stored in the bag.

  as fast as possible (default)  after each step, wait for the planner's CandidateSet of that step
                                 (or --step-timeout) before the next one: no cycle is skipped; a
                                 step still without a plan after --resend-after is published again
  --realtime [--rate R]          publish on the bag's timeline (R x speed) without waiting

It records the planner outputs (and the inputs) into an output bag, then reports open-loop metrics
of the plans against the log (ADE/FDE of the selected and best-of-M candidates vs the logged ego
future, CR/DCR/SCR, via rad2_core.open_loop_metrics), the per-stage latency and deadline misses
from planning/diagnostics, and the wall-clock latency input-publish -> candidates-received.
Writes <out>/replay_eval.json, <out>/*.png and the bag <out>/outputs. The work is done by
rad2_bringup.replay_player.run_replay (scoring and plots: rad2_evaluation.replay). The bag of inputs
comes from `rad2 data to-bag` (or a recording of a vehicle's inputs).

examples:
  rad2 eval replay --bag runs/bags/clip0 --out runs/replay/clip0
  rad2 eval replay --bag runs/bags/clip0 --realtime --max-steps 50
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from rad2_core.config import parse_node_overrides
from rad2_datasets import bags
from rad2_evaluation.replay import ReplayError
from rad2_ros.nodes.recording import RecordError

from rad2_bringup.cli.common import in_ros_environment, verb_parser


def _replay(args: argparse.Namespace) -> int:
    from rich.console import Console

    from rad2_bringup.replay_player import run_replay

    console = Console()
    report = run_replay(
        args.bag, args.out, max_steps=args.max_steps, map_file=args.map_file, clip_id=args.clip_id,
        overrides=parse_node_overrides(args.set or []), domain_id=args.domain_id, composed=args.composed,
        realtime=args.realtime, rate=args.rate, step_timeout=args.step_timeout,
        first_step_timeout=args.first_step_timeout, resend_after=args.resend_after,
        startup_timeout=args.startup_timeout,
        record_perception=args.record_perception, log=console.print,
    )
    out = Path(args.out)
    console.print(f"wrote {out / 'replay_eval.json'}, {out}/*.png and the bag {out / 'outputs'}")
    missing = report["steps"] - report["plans_received"]
    if missing > 0 and not args.realtime:
        console.print(f"[yellow]{missing} step(s) got no plan within --step-timeout")
    if report["steps_resent"]:
        console.print(f"[yellow]{report['steps_resent']} step(s) were re-sent after --resend-after "
                      f"({report['resends']} copies; the nodes' streams are best effort)")
    return 0


def _parser() -> argparse.ArgumentParser:
    from rad2_core.cli_args import float_in, int_at_least

    parser = verb_parser("eval replay", __doc__)
    parser.add_argument("--bag", required=True, help="bag of perception inputs (rad2 data to-bag)")
    parser.add_argument("--out", help="output directory (default runs/replay/<bag name>)")
    parser.add_argument("--realtime", action="store_true",
                        help="play on the bag's timeline instead of lock-step")
    parser.add_argument("--rate", type=float_in(0.0, 100.0, exclusive_min=True), default=1.0,
                        help="speed factor of --realtime (default 1)")
    parser.add_argument("--max-steps", type=int_at_least(1), help="replay only the first N steps")
    parser.add_argument("--step-timeout", type=float_in(0.0, 3600.0, exclusive_min=True), default=5.0,
                        help="lock-step mode: seconds to wait for a step's plan (default %(default)s)")
    parser.add_argument("--first-step-timeout", type=float_in(0.0, 3600.0, exclusive_min=True), default=30.0,
                        help="the same for the first step (model warm-up; default %(default)s)")
    parser.add_argument("--resend-after", type=float_in(0.0, 3600.0, exclusive_min=True), default=2.0,
                        help="lock-step mode: re-publish a step's inputs when it has no plan after this "
                             "many seconds (best-effort streams may lose a sample; default %(default)s)")
    parser.add_argument("--startup-timeout", type=float_in(0.0, 3600.0, exclusive_min=True), default=60.0,
                        help="seconds for the nodes to come up (default %(default)s)")
    parser.add_argument("--map-file", help="override the bag's rad2.map_file (clip .npz or dataset dir)")
    parser.add_argument("--clip-id", help="override the bag's rad2.clip_id")
    parser.add_argument("--set", action="append", metavar="NODE.PARAM=VALUE",
                        help="parameter override for a node of the graph (repeatable)")
    parser.add_argument("--composed", action="store_true", help="run both nodes in one process (executor)")
    parser.add_argument("--record-perception", action="store_true",
                        help="also record perception/scene_tokens and bev_features into the output bag")
    parser.add_argument("--domain-id", type=int_at_least(0, 232), default=None,
                        help="ROS_DOMAIN_ID for the replay graph (default: 100 + pid %% 100, isolated)")
    return parser


def main(argv: list[str]) -> int:
    argv = list(argv)
    parser = _parser()
    args = parser.parse_args(argv)
    if args.domain_id is None:
        args.domain_id = 100 + os.getpid() % 100
        argv += ["--domain-id", str(args.domain_id)]
    if args.out is None:
        args.out = str(Path("runs") / "replay" / Path(args.bag).resolve().name)
    try:
        bags.resolve_bag_path(args.bag)  # fail fast on a missing bag, before any environment work
        in_ros_environment("eval replay", argv, args.domain_id)
        return _replay(args)
    except (ReplayError, RecordError, bags.BagError, ValueError) as exc:
        print(f"rad2 eval replay: error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # bring-up failures (BringupError) and the like
        if type(exc).__name__ in ("BringupError", "GraphError", "RosEnvironmentError"):
            print(f"rad2 eval replay: error: {exc}", file=sys.stderr)
            return 2
        raise

