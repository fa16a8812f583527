"""Soak benchmark of the safety layer (not a test): the closed-loop simulation graph under a CPU hog.

The library side of rad2 graph soak (see its --help for what is measured): :func:`run_soak` brings
up graph "simulation" (planner, controller, heartbeat supervisor, then the BEV-Warp sim node), starts
busy-loop processes, watches the graph with rad2_ros.nodes.monitor's Monitor and classifies every
fallback; optionally kills and restarts the planner and times the controller's minimal-risk stop.
rclpy is imported when the Monitor is made.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from rad2_core.config import resource_path
from rad2_core.storage import read_index

from rad2_bringup.bringup import Bringup

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
    if "in the future" in reason or "ahead of the node clock" in reason:
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
    if reason.startswith("braking"):  # the plan made before a stop ended, tracked after it
        return "recovery braking"
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


def watch_heartbeats(monitor) -> tuple[list[tuple[int, str, str]], dict[str, list[int]]]:
    """Subscribe the monitor's node to /diagnostics and the heartbeats; returns the lists they fill:
    supervisor reports of lost heartbeats (wall time, name, message) and, per node name, the wall
    times heartbeats arrive at this process."""
    from diagnostic_msgs.msg import DiagnosticArray
    from rad2_ros.nodes.common import HEARTBEAT_TOPIC, heartbeat_qos
    from std_msgs.msg import Header

    reports: list[tuple[int, str, str]] = []
    arrivals: dict[str, list[int]] = {}

    def on_diag(m):
        for st in m.status:
            level = st.level[0] if isinstance(st.level, bytes) else int(st.level)
            if st.name.startswith("heartbeat/") and level == 2:
                reports.append((time.time_ns(), st.name, st.message))

    def on_heartbeat(m):
        arrivals.setdefault(m.frame_id, []).append(time.time_ns())

    monitor.node.create_subscription(DiagnosticArray, "/diagnostics", on_diag, 50)
    monitor.node.create_subscription(Header, HEARTBEAT_TOPIC, on_heartbeat, heartbeat_qos())
    return reports, arrivals


def soak(stack, sim, monitor, minutes: float, progress: bool = True) -> tuple[int, int, list[float]]:
    """Spin the monitor for ``minutes`` (checking the processes each second); returns the wall-clock
    start and end (ns) and the 1-min load average sampled each second."""
    from tqdm import tqdm

    t0 = time.time_ns()
    loads = []
    total = int(minutes * 60)
    with tqdm(total=total, desc="soak", unit="s", disable=not progress) as bar:
        for _ in range(total):
            monitor.spin(1.0)
            stack.check_alive()
            sim.check_alive()
            loads.append(os.getloadavg()[0])
            bar.set_postfix(clips=len(monitor.results), load=f"{loads[-1]:.1f}")
            bar.update(1)
    return t0, time.time_ns(), loads


def run_soak(dataset: str, minutes: float, hogs: int, kills: int = 0, domain_id: int | None = None,
             log_dir: str | Path = "runs/soak", ready_timeout: float = 120.0,
             progress: bool = True) -> dict[str, Any]:
    """The whole soak (see the module doc); returns the figures."""
    from rad2_ros.nodes.monitor import Monitor

    out_dir = Path(log_dir).resolve()
    domain = int(os.environ.get("ROS_DOMAIN_ID", "0")) if domain_id is None else domain_id
    dataset_path = str(resource_path(dataset))
    read_index(dataset_path)  # not a dataset: say so now, not after minutes of a sim node that drives nothing
    common = {"graph": "simulation", "args": {"dataset": dataset_path, "max_clips": "0"},
              "domain_id": domain, "log_dir": out_dir}
    stack = Bringup(**common, only=["planner", "controller", "supervisor"])
    sim = Bringup(**common, only=["bev_warp_sim"])
    restarted: list[Bringup] = []
    monitor = Monitor(None, False, recorded_by="rad2 graph soak")
    heartbeat_reports, heartbeat_arrivals = watch_heartbeats(monitor)
    hog_procs: list[subprocess.Popen] = []
    res: dict[str, Any] = {"dataset": dataset, "hogs": hogs, "minutes": minutes}
    try:
        stack.start()
        stack.wait_ready(ready_timeout)
        sim.start()
        sim.wait_ready(ready_timeout)
        print(f"[soak] graph up (logs {out_dir}); {hogs} CPU hogs for {minutes:g} min", flush=True)
        hog_procs = start_hogs(hogs)
        t0, t1, loads = soak(stack, sim, monitor, minutes, progress)
        stop_hogs(hog_procs)
        hog_procs = []
        res.update(soak_figures(monitor, heartbeat_reports, t0, t1, loads))
        res["heartbeat_gaps_at_monitor"] = heartbeat_gaps(heartbeat_arrivals, t0, t1)
        if kills:
            # the graph runs on the simulator's clock, which falls behind the wall clock under load:
            # let it catch up before timing stops on the wall clock
            monitor.spin(5.0)
            res["kills"] = kill_loop(kills, ready_timeout, monitor, stack, restarted, common)
    finally:
        stop_hogs(hog_procs)
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
    starts = clip_start_times(monitor)
    cdiags = [d for d in monitor.control_diags if d["receive_ns"] and t0 <= d["receive_ns"] <= t1]

    def near_start(t: int) -> bool:
        lo, hi = CLIP_START_WINDOW_NS
        i = np.searchsorted(starts, t - hi, side="left")  # first start after t - hi
        return i < len(starts) and starts[i] <= t - lo

    # stops only: a cycle that tracks a plan braking hard names it too, without the fallback flag
    controller = episodes([d["receive_ns"] for d in cdiags],
                          [classify_controller(d["fallback_reason"] if d["fallback_active"] else "",
                                               near_start(d["receive_ns"])) for d in cdiags])
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


def clip_start_times(monitor) -> list[int]:
    """Clip starts on this process's clock: the arrival of the first odometry of each clip (sorted)."""
    clip_first: dict[int, int] = {}
    for (stamp, *_), clip in zip(monitor.odom, monitor.clip_of_odom):
        clip_first.setdefault(clip, monitor.t_input[stamp])
    return sorted(clip_first.values())


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


def kill_loop(kills: int, ready_timeout: float, monitor, stack, restarted: list,
              common: dict) -> dict[str, Any]:
    """Kill the planner ``kills`` times; latency from the last trajectory to the first stop."""
    latencies, after_kill = [], []
    planner = stack.process("planner")
    for k in range(kills):
        wait_for_fresh_trajectory(monitor)
        t_kill = time.time_ns()
        planner.signal(signal.SIGKILL)
        last_traj = max(monitor.t_traj.values())
        monitor.spin(1.0)
        stops = [c for c in monitor.commands if c[0] > t_kill and c[1]]
        if stops:
            latencies.append((stops[0][0] - last_traj) / 1e6)
            after_kill.append((stops[0][0] - t_kill) / 1e6)
            print(f"[soak] kill {k + 1}/{kills}: stop {latencies[-1]:.0f} ms after the last trajectory "
                  f"({after_kill[-1]:.0f} ms after the kill): {stops[0][2][:80]}", flush=True)
        else:
            after = [c for c in monitor.commands if c[0] > t_kill]
            print(f"[soak] kill {k + 1}/{kills}: NO STOP within 1 s ({len(after)} commands, planner "
                  f"alive: {planner.alive()}, last: {after[-1:]})", flush=True)
        log_dir = Path(common["log_dir"]) / f"planner_restart_{k}"
        b = Bringup(**{**common, "log_dir": log_dir}, only=["planner"])
        b.start()
        b.wait_ready(ready_timeout)
        restarted.append(b)
        planner = b.process("planner")
    return {"count": kills, "stops": len(latencies), "since_last_trajectory_ms": latencies,
            "since_kill_ms": after_kill,
            "max_ms": max(latencies) if latencies else None}




def wait_for_fresh_trajectory(monitor, timeout: float = 60.0) -> None:
    """Spin until the controller is tracking, then until just after a fresh trajectory arrived."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        monitor.spin(0.05)
        if monitor.commands and not monitor.commands[-1][1] and len(monitor.t_traj) > 5:
            n = len(monitor.t_traj)
            while len(monitor.t_traj) == n and time.monotonic() < end:
                monitor.spin(0.005)
            monitor.spin(0.03)
            if monitor.commands and not monitor.commands[-1][1]:
                break
