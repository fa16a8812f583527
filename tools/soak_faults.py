#!/usr/bin/env python3
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
    at-fault rate without any fault, see README), load average.
With --kills N it then kills the planner N times (SIGKILL just after a trajectory, restarted in
between) and reports the time from the last trajectory to the controller's first minimal-risk stop.

  python tools/soak_faults.py --minutes 10 --hogs 4
  python tools/soak_faults.py --minutes 2 --hogs 4 --kills 10 --out runs/soak/soak.json
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

HOG = "while True:\n    pass\n"
# what a clip start looks like to the controller: the ego placed elsewhere (the odometry jump waits for
# its confirmation, then a localization reset), no plan for the new place yet
# (a trajectory planned from the new clip's first inputs can arrive while the jump still awaits its
# confirmation: "no odometry near the trajectory stamp")
CLIP_START_REASONS = ("pose_jump", "acceleration", "localization reset", "no trajectory", "predates",
                      "stale trajectory", "odometry lost", "no odometry near")
# a controller report belongs to a clip start from shortly before this monitor saw the clip's first
# odometry (the controller may receive it first) until the relocalisation settled
CLIP_START_WINDOW_NS = (-1_000_000_000, 3_000_000_000)


def classify_planner(reason: str) -> str:
    if not reason:
        return "ok"
    if "no planning input" in reason:
        return "starved"
    if "in the future" in reason:
        return "false: future stamp"
    if "stale input" in reason:
        return "late: stale input"
    if "rejected plan" in reason:  # valid input, implausible output of the planner itself
        return "planner output implausible"
    if "implausible" in reason or "rejected input" in reason:
        return "false: input rejected"
    return "other: " + reason.split(":")[0]


def classify_controller(reason: str, near_clip_start: bool) -> str:
    if not reason:
        return "ok"
    if "predates the localization reset" in reason or (
            near_clip_start and any(k in reason for k in CLIP_START_REASONS)):
        return "clip start"
    if "planner heartbeat lost" in reason:
        return "false: planner heartbeat lost"
    if "odometry rejected" in reason:
        return "false: odometry rejected"
    if "invalid trajectory" in reason:
        return "false: trajectory rejected"
    if "odometry lost" in reason:
        return "late: odometry lost"
    if "stale trajectory" in reason:
        return "late: stale trajectory"
    return "other: " + reason.split(":")[0]


def episodes(times_ns: list[int], labels: list[str]) -> Counter:
    """Count runs of consecutive equal labels (one stop of 20 cycles is one event)."""
    out: Counter = Counter()
    prev = None
    for lab in labels:
        if lab != prev and lab != "ok":
            out[lab] += 1
        prev = lab
    return out


def start_hogs(n: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", HOG], start_new_session=True) for _ in range(n)]


def stop_hogs(hogs: list[subprocess.Popen]) -> None:
    for h in hogs:
        h.kill()
    for h in hogs:
        h.wait()


def run(args: argparse.Namespace) -> dict[str, Any]:
    from rad2_planner.bringup import Bringup
    from rad2_planner.nodes.monitor import Monitor
    from tqdm import tqdm

    out_dir = Path(args.log_dir).resolve()
    domain = int(os.environ.get("ROS_DOMAIN_ID", "0")) if args.domain_id is None else args.domain_id
    dataset = str((ROOT / args.dataset) if not Path(args.dataset).is_absolute() else Path(args.dataset))
    common = {"graph": "simulation", "args": {"dataset": dataset, "max_clips": "0"}, "domain_id": domain,
              "log_dir": out_dir}
    stack = Bringup(**common, only=["planner", "controller", "supervisor"])
    sim = Bringup(**common, only=["bev_warp_sim"])
    restarted: list[Bringup] = []
    monitor = Monitor(None, False, recorded_by="tools/soak_faults.py")
    from diagnostic_msgs.msg import DiagnosticArray

    heartbeat_reports: list[tuple[int, str, str]] = []
    heartbeat_arrivals: dict[str, list[int]] = {}  # node name -> wall receive times at this monitor

    def on_diag(m):
        for st in m.status:
            level = st.level[0] if isinstance(st.level, bytes) else int(st.level)
            if st.name.startswith("heartbeat/") and level == 2:
                heartbeat_reports.append((time.time_ns(), st.name, st.message))

    def on_heartbeat(m):
        heartbeat_arrivals.setdefault(m.frame_id, []).append(time.time_ns())

    from rad2_planner.nodes.common import HEARTBEAT_TOPIC, heartbeat_qos
    from std_msgs.msg import Header

    monitor.node.create_subscription(DiagnosticArray, "/diagnostics", on_diag, 50)
    monitor.node.create_subscription(Header, HEARTBEAT_TOPIC, on_heartbeat, heartbeat_qos())
    hogs: list[subprocess.Popen] = []
    res: dict[str, Any] = {"dataset": args.dataset, "hogs": args.hogs, "minutes": args.minutes}
    try:
        stack.start()
        stack.wait_ready(args.ready_timeout)
        sim.start()
        sim.wait_ready(args.ready_timeout)
        print(f"[soak] graph up (logs {out_dir}); {args.hogs} CPU hogs for {args.minutes:g} min", flush=True)
        hogs = start_hogs(args.hogs)
        t0 = time.time_ns()
        loads = []
        total = int(args.minutes * 60)
        with tqdm(total=total, desc="soak", unit="s", disable=args.no_progress) as bar:
            for _ in range(total):
                monitor.spin(1.0)
                stack.check_alive()
                sim.check_alive()
                loads.append(os.getloadavg()[0])
                bar.set_postfix(clips=len(monitor.results), load=f"{loads[-1]:.1f}")
                bar.update(1)
        t1 = time.time_ns()
        stop_hogs(hogs)
        hogs = []
        res.update(soak_figures(monitor, heartbeat_reports, t0, t1, loads))
        res["heartbeat_gaps_at_monitor"] = heartbeat_gaps(heartbeat_arrivals, t0, t1)
        if args.kills:
            # the graph runs on the simulator's clock, which falls behind the wall clock under load:
            # let it catch up before timing stops on the wall clock
            monitor.spin(5.0)
            res["kills"] = kill_loop(args, monitor, stack, restarted, common)
    finally:
        stop_hogs(hogs)
        codes = {}
        for b in (sim, *restarted, stack):
            codes.update(b.stop())
        res["exit_codes"] = codes
        monitor.close()
    return res


def soak_figures(monitor, heartbeat_reports, t0: int, t1: int, loads: list[float]) -> dict[str, Any]:
    import numpy as np

    pdiags = [d for d in monitor.planner_diags if d["receive_ns"] and t0 <= d["receive_ns"] <= t1]
    planner = episodes([d["receive_ns"] for d in pdiags],
                       [classify_planner(d["fallback_reason"]) for d in pdiags])
    planner_cycles = Counter(classify_planner(d["fallback_reason"]) for d in pdiags)
    # clip starts on this process's clock: the first odometry of each clip
    clip_first: dict[int, int] = {}
    for (stamp, *_), clip in zip(monitor.odom, monitor.clip_of_odom):
        clip_first.setdefault(clip, monitor.t_input[stamp])
    starts = sorted(clip_first.values())
    cdiags = [d for d in monitor.control_diags if d["receive_ns"] and t0 <= d["receive_ns"] <= t1]

    def near_start(t: int) -> bool:
        lo, hi = CLIP_START_WINDOW_NS
        i = np.searchsorted(starts, t - hi, side="left")  # first start after t - hi
        return i < len(starts) and starts[i] <= t - lo

    controller = episodes([d["receive_ns"] for d in cdiags],
                          [classify_controller(d["fallback_reason"], near_start(d["receive_ns"]))
                           for d in cdiags])
    results = list(monitor.results)
    false_total = sum(v for k, v in planner.items() if k.startswith("false")) + \
        sum(v for k, v in controller.items() if k.startswith("false"))
    lost = [r for r in heartbeat_reports if t0 <= r[0] <= t1]
    return {
        "duration_s": (t1 - t0) / 1e9,
        "load_avg_1min": {"mean": float(np.mean(loads)) if loads else float("nan"),
                          "min": float(np.min(loads)) if loads else float("nan")},
        "planner_cycles": len(pdiags),
        "planner_cycles_by_kind": dict(planner_cycles),
        "planner_fallback_events": dict(planner),
        "controller_cycles": len(cdiags),
        "controller_stop_events": dict(controller),
        "false_rejection_events": false_total,
        "supervisor_heartbeat_loss_reports": len(lost),
        "clips_completed": len(results),
        "collisions": sum(bool(r.get("collided")) for r in results),
        "at_fault_collisions": sum(bool(r.get("collided") and r.get("at_fault")) for r in results),
        "at_fault_clips": [r.get("clip_id") for r in results if r.get("collided") and r.get("at_fault")],
        "offroad": sum(bool(r.get("offroad")) for r in results),
    }


def heartbeat_gaps(arrivals: dict[str, list[int]], t0: int, t1: int) -> dict[str, Any]:
    """Per node: the gaps between consecutive heartbeats arriving at this (monitor) process: how late
    the beats themselves were, independent of how the controller judged them."""
    import numpy as np

    out = {}
    for name, times in sorted(arrivals.items()):
        t = np.array([x for x in times if t0 <= x <= t1], dtype=np.int64)
        if len(t) < 2:
            continue
        gaps_ms = np.diff(t) / 1e6
        out[name] = {"beats": int(len(t)), "p50_ms": float(np.percentile(gaps_ms, 50)),
                     "p99_ms": float(np.percentile(gaps_ms, 99)), "max_ms": float(gaps_ms.max()),
                     "over_150ms": int((gaps_ms > 150).sum()), "over_300ms": int((gaps_ms > 300).sum())}
    return out


def kill_loop(args, monitor, stack, restarted: list, common: dict) -> dict[str, Any]:
    """Kill the planner ``args.kills`` times; latency from the last trajectory to the first stop."""
    from rad2_planner.bringup import Bringup

    latencies, after_kill = [], []
    planner = stack.process("planner")
    for k in range(args.kills):
        end = time.monotonic() + 60
        while time.monotonic() < end:  # tracking, then just after a fresh trajectory
            monitor.spin(0.05)
            if monitor.commands and not monitor.commands[-1][1] and len(monitor.t_traj) > 5:
                n = len(monitor.t_traj)
                while len(monitor.t_traj) == n and time.monotonic() < end:
                    monitor.spin(0.005)
                monitor.spin(0.03)
                if monitor.commands and not monitor.commands[-1][1]:
                    break
        t_kill = time.time_ns()
        planner.signal(signal.SIGKILL)
        last_traj = max(monitor.t_traj.values())
        monitor.spin(1.0)
        stops = [c for c in monitor.commands if c[0] > t_kill and c[1]]
        if stops:
            latencies.append((stops[0][0] - last_traj) / 1e6)
            after_kill.append((stops[0][0] - t_kill) / 1e6)
            print(f"[soak] kill {k + 1}/{args.kills}: stop {latencies[-1]:.0f} ms after the last trajectory "
                  f"({after_kill[-1]:.0f} ms after the kill): {stops[0][2][:80]}", flush=True)
        else:
            after = [c for c in monitor.commands if c[0] > t_kill]
            print(f"[soak] kill {k + 1}/{args.kills}: NO STOP within 1 s ({len(after)} commands, planner "
                  f"alive: {planner.alive()}, last: {after[-1:]})", flush=True)
        log_dir = Path(common["log_dir"]) / f"planner_restart_{k}"
        b = Bringup(**{**common, "log_dir": log_dir}, only=["planner"])
        b.start()
        b.wait_ready(args.ready_timeout)
        restarted.append(b)
        planner = b.process("planner")
    return {"count": args.kills, "stops": len(latencies), "since_last_trajectory_ms": latencies,
            "since_kill_ms": after_kill,
            "max_ms": max(latencies) if latencies else None}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=10.0, help="soak duration under the CPU hog")
    ap.add_argument("--hogs", type=int, default=4, help="busy-loop processes (load average ~ hogs + 1)")
    ap.add_argument("--dataset", default="data/eval_efficiency", help="clips the sim node drives in turn")
    ap.add_argument("--kills", type=int, default=0, help="afterwards, kill and restart the planner N times")
    ap.add_argument("--domain-id", type=int, default=None, help="ROS_DOMAIN_ID (default: environment or 0)")
    ap.add_argument("--log-dir", default="runs/soak", help="node logs")
    ap.add_argument("--out", default=None, help="write the figures as JSON here")
    ap.add_argument("--ready-timeout", type=float, default=120.0)
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = ap.parse_args(argv)
    from rad2_planner.rosenv import RosEnvironmentError, ensure_ros_environment

    try:
        ensure_ros_environment(__file__, sys.argv[1:] if argv is None else argv, args.domain_id)
    except RosEnvironmentError as exc:
        print(f"soak_faults: {exc}", file=sys.stderr)
        return 2
    from rad2_planner.bringup import BringupError

    try:
        res = run(args)
    except BringupError as exc:
        print(f"soak_faults: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(res, indent=2, default=float))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(res, indent=2, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main())
