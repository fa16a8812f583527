"""The closed-loop demo (`make demo`): the ROS 2 graph on bundled evaluation clips, as separate processes.

Brings up graph "simulation" of launch/graphs.yaml with rad2_bringup.bringup (planner + controller first,
then the BEV-Warp sim node, which replaces the vehicle and the perception node), drives a handful of
clips from data/eval_efficiency and data/eval_safety in real time (10 Hz), and meanwhile
  - records the run into an MCAP bag (rosbag2 layout, opens in Foxglove) with rad2_ros.nodes.monitor's
    Monitor: odometry, scene tokens, candidates, trajectory, path, markers, diagnostics, commands,
    episode results, /clock (BEV rasters only with --record-bev: ~0.65 MB each);
  - measures end-to-end latency on this process's wall clock: arrival of a step's odometry (the sim
    publishes odometry, BEV, tokens of one step together) -> arrival of the trajectory planned from
    that stamp, and -> the first controller cycle that used that trajectory (control/diagnostics
    input_stamp), plus the planner's own per-stage timings from planning/diagnostics.
First the same clips are driven with the baseline (--baseline: by default the configured generator with
the discriminator RL trained for it), then with the configured planner (params/planner.yaml); after both
it prints them side by side (<out>/comparison.json, comparison.png; --no-baseline skips the first).
Each run prints the closed-loop metric table (bev_warp_sim.metrics) and the latency tables, writes
<out>/demo.json and a GIF of the worst clip (rad2_evaluation.closed_loop.render_episode_gif).
The work is done by rad2_bringup.demo.run_demo.

examples:
  rad2 demo                                 # 4 clips (2 + 2), outputs in runs/demo
  rad2 demo --clips 2 --no-gif --out /tmp/demo
  rad2 demo --dataset data/eval_safety --clip-ids sumo_cut_in_20250102
"""

from __future__ import annotations

import argparse
import sys

from rad2_bringup.cli.common import in_ros_environment, verb_parser
from rad2_bringup.demo import (
    DEFAULT_BASELINE,
    DEFAULT_SPLITS,
    DemoError,
    demo_overrides,
    run_comparison,
    run_demo,
)


def _parser() -> argparse.ArgumentParser:
    from rad2_core.cli_args import float_in, int_at_least, schema_value

    ap = verb_parser("demo", __doc__)
    ap.add_argument("--clips", type=int_at_least(1, 10000), default=4,
                    help="number of clips, round-robin over the datasets")
    ap.add_argument("--dataset", nargs="+", default=None,
                    help=f"dataset directories (default: {' '.join(DEFAULT_SPLITS)})")
    ap.add_argument("--clip-ids", nargs="+", default=None, help="drive these clips (from --dataset)")
    ap.add_argument("--out", default="runs/demo", help="output directory (bag, GIF, demo.json, logs)")
    ap.add_argument("--backend", type=schema_value("planner", "planner.backend"), default=None,
                    help="override planner.backend (pytorch | onnxruntime | openvino | tensorrt)")
    ap.add_argument("--set", action="append", default=[], metavar="NODE.PARAM=VALUE",
                    help="parameter override, e.g. planner.planner.num_candidates=16")
    ap.add_argument("--realtime-factor", type=schema_value("sim", "node.realtime_factor"), default=1.0,
                    help="simulated seconds per wall second")
    ap.add_argument("--domain-id", type=int_at_least(0, 232), default=None,
                    help="ROS_DOMAIN_ID (default: environment or 0)")
    ap.add_argument("--timeout", type=float_in(0.0, 86400.0, exclusive_min=True), default=600.0,
                    help="give up after this many seconds of driving")
    ap.add_argument("--ready-timeout", type=float_in(0.0, 3600.0, exclusive_min=True), default=120.0,
                    help="seconds to wait for the nodes")
    ap.add_argument("--no-bag", action="store_true", help="do not write the MCAP bag")
    ap.add_argument("--record-bev", action="store_true", help="also record perception/bev_features")
    ap.add_argument("--no-gif", action="store_true", help="do not render the GIF")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    ap.add_argument("--baseline", default=DEFAULT_BASELINE,
                    help="first drive the same clips with this planner checkpoint (its fallback selection "
                         "rule when its discriminator is untrained) and print both side by side "
                         "(default %(default)s, the RL-trained discriminator on the default generator)")
    ap.add_argument("--no-baseline", action="store_true", help="drive the configured planner only")
    return ap


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    from rad2_ros.rosenv import RosEnvironmentError

    try:
        in_ros_environment("demo", argv, args.domain_id)
    except RosEnvironmentError as exc:
        print(f"rad2 demo: error: {exc}", file=sys.stderr)
        return 2
    from rad2_core.config import ParameterError

    from rad2_bringup.bringup import BringupError

    try:
        kwargs = dict(splits=args.dataset, num_clips=args.clips, clip_ids=args.clip_ids,
                      overrides=demo_overrides(args.backend, args.set, args.realtime_factor),
                      domain_id=args.domain_id, timeout=args.timeout, ready_timeout=args.ready_timeout,
                      bag=not args.no_bag, record_bev=args.record_bev, gif=not args.no_gif,
                      progress=not args.no_progress)
        if args.no_baseline:
            run_demo(args.out, **kwargs)
        else:
            run_comparison(args.out, args.baseline, **kwargs)
    except (DemoError, BringupError, ParameterError) as exc:
        print(f"rad2 demo: error: {exc}", file=sys.stderr)
        return 1
    return 0
