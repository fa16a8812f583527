"""Soak benchmark of the safety layer (not a test): the closed-loop simulation graph under a CPU hog.

Brings up graph "simulation" of launch/graphs.yaml as separate processes (planner, controller,
heartbeat supervisor, then the BEV-Warp sim node driving the clips of --dataset in real time), starts
--hogs busy-loop processes (each in its own session, so the load average reaches about hogs + 1) and
watches the graph for --minutes. Every input the simulator produces is valid, so every rejection of an
input is a false one; it reports:
  - false rejections: planner inputs rejected as implausible or "from the future", controller
    trajectories or odometry rejected (odometry jumps at a
    clip start, the next clip placed elsewhere, are counted apart: the relocalisation is confirmed
    after validators.odometry.reset_confirm_samples samples), planner heartbeat losses while it lives;
  - late inputs (stale under load: rejected correctly, counted apart), starved planner periods and
    plans the planner itself produced implausible (valid input, output rejected by its own check);
  - clips driven, collisions and at-fault collisions (bev_warp_sim.metrics; the IL policy has its own
    at-fault rate without any fault, see docs/results.md), load average.
With --kills N it then kills the planner N times (SIGKILL just after a trajectory, restarted in
between) and reports the time from the last trajectory to the controller's first minimal-risk stop.
The work is done by rad2_bringup.soak.run_soak.

examples:
  rad2 graph soak --minutes 10 --hogs 4
  rad2 graph soak --minutes 2 --hogs 4 --kills 10 --out runs/soak/soak.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from rad2_bringup.cli.common import in_ros_environment, verb_parser


def main(argv: list[str]) -> int:
    from rad2_core.cli_args import float_in, int_at_least

    ap = verb_parser("graph soak", __doc__)
    ap.add_argument("--minutes", type=float_in(0.0, 1440.0, exclusive_min=True), default=10.0,
                    help="soak duration under the CPU hog")
    ap.add_argument("--hogs", type=int_at_least(0, 64), default=4,
                    help="busy-loop processes (load average ~ hogs + 1)")
    ap.add_argument("--dataset", default="data/eval_efficiency", help="clips the sim node drives in turn")
    ap.add_argument("--kills", type=int_at_least(0, 1000), default=0,
                    help="afterwards, kill and restart the planner N times")
    ap.add_argument("--domain-id", type=int_at_least(0, 232), default=None,
                    help="ROS_DOMAIN_ID (default: environment or 0)")
    ap.add_argument("--log-dir", default="runs/soak", help="node logs")
    ap.add_argument("--out", default=None, help="write the figures as JSON here")
    ap.add_argument("--ready-timeout", type=float_in(0.0, 3600.0, exclusive_min=True), default=120.0)
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = ap.parse_args(argv)
    from rad2_ros.rosenv import RosEnvironmentError

    try:
        in_ros_environment("graph soak", argv, args.domain_id)
    except RosEnvironmentError as exc:
        print(f"rad2 graph soak: error: {exc}", file=sys.stderr)
        return 2
    from rad2_bringup.bringup import BringupError
    from rad2_bringup.soak import run_soak

    try:
        res = run_soak(args.dataset, args.minutes, args.hogs, args.kills, args.domain_id, args.log_dir,
                       args.ready_timeout, progress=not args.no_progress)
    except BringupError as exc:
        print(f"rad2 graph soak: error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(res, indent=2, default=float))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(res, indent=2, default=float))
    return 0

