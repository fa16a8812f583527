"""Rollout throughput (rad2 bench rollouts is the CLI): the simulator alone, the real planner in
this process and on Ray workers (rad2_training.workers), and the pickled size of a simulator state. No ROS.
"""

from __future__ import annotations

import os
import pickle
import time


def bench_simulator(params: dict, clips, group: int, h_reuse: int, batch: int) -> tuple[int, float]:
    """Env steps and seconds of the simulator alone: one fixed control sequence per decision."""
    import numpy as np
    from bev_warp_sim.rollout import chunk_rows, expand_rows
    from bev_warp_sim.simulator import Simulator
    from bev_warp_sim.state import Controls

    sim = Simulator(params)
    hold = Controls(np.zeros((sim.controller.horizon, 2)))
    steps, t0 = 0, time.perf_counter()
    for chunk in chunk_rows(expand_rows(clips, group), batch):
        state = sim.init([r.clip for r in chunk], [r.start_step for r in chunk])
        while not state.done.all():
            need = np.flatnonzero(sim.needs_decision(state))
            if len(need):
                sim.observe(state, need)
                state = sim.commit(state, {int(b): hold for b in need}, h_reuse=h_reuse)
            steps += int((~state.done).sum())
            state, _ = sim.step(state)
    return steps, time.perf_counter() - t0


def state_sizes(params: dict, clip) -> tuple[int, int]:
    """Pickled bytes of a one-clip state at the start and after driving the whole clip."""
    import numpy as np
    from bev_warp_sim.simulator import Simulator
    from bev_warp_sim.state import Controls

    sim = Simulator(params)
    state = sim.init([clip], [0])
    start = len(pickle.dumps(state))
    hold = Controls(np.zeros((sim.controller.horizon, 2)))
    while not state.done.all():
        if sim.needs_decision(state)[0]:
            state = sim.commit(state, {0: hold})
        state, _ = sim.step(state)
    return start, len(pickle.dumps(state))


def bench_planner(params: dict, spec, clips, group: int, h_reuse: int, batch: int, workers: int):
    """(env steps, decisions, seconds) with the real planner in this process (0) or Ray workers."""
    from bev_warp_sim.rollout import run_rollouts
    from bev_warp_sim.simulator import Simulator

    kwargs = dict(batch_size=batch, h_reuse=h_reuse, seed=0)
    if workers == 0:
        decider, sim = spec.build(params), Simulator(params)
        run_rollouts(sim, decider, clips[:1], 1, max_steps=4, **kwargs)  # warm-up (ONNX export, caches)
        t0 = time.perf_counter()
        _, stats = run_rollouts(sim, decider, clips, group, **kwargs)
        return stats.env_steps, stats.decisions, time.perf_counter() - t0
    from rad2_training.workers import RolloutPool

    with RolloutPool(spec, params, num_workers=workers, address="") as pool:
        pool.run(clips[:workers], 1, max_steps=4, **kwargs)  # warm-up: every worker loaded
        t0 = time.perf_counter()
        _, stats = pool.run(clips, group, **kwargs)
        return stats.env_steps, stats.decisions, time.perf_counter() - t0


def run_rollout_benchmark(dataset: str, params: dict, *, clips: int = 8, group: int = 4, h_reuse: int = 8,
                          batch: int = 16,
                          candidates: int = 32, workers: list[int] = (0, 2), backend: str = "onnxruntime",
                          device: str = "cpu", runtime_overrides: dict | None = None) -> str:
    """The Markdown table of rad2 bench rollouts (printed by the caller); ``backend`` / ``device``:
    the planner's runtime (``pytorch`` on ``cuda`` times the rollouts with the networks on a GPU);
    ``runtime_overrides``: its ``runtime.*`` settings (``{"openvino": {"precision": "bf16"}}``);
    ``params``: every file of params/ as loaded, merged."""
    from rad2_core.machine import machine_info
    from rad2_core.storage import load_dataset
    from rad2_training.workers import PolicySpec

    clip_list = load_dataset(dataset)[:clips]
    load0 = os.getloadavg()[0]
    threads = int(params["rollout"]["threads_per_worker"])
    sim_steps, sim_s = bench_simulator(params, clip_list, group, h_reuse, batch)
    rows = [("simulator alone (fixed controls)", 0, sim_steps, 0, sim_s)]
    for w in workers:
        spec = PolicySpec(name="rad2", backend=backend, selection="sample", distribution="softmax",
                          always_score=True, threads=None if w == 0 else threads,
                          planner_overrides={"num_candidates": candidates, "device": device},
                          runtime_overrides=dict(runtime_overrides or {}))
        runtime = backend if device == "cpu" else f"{backend} on {device}"
        if backend == "openvino":
            runtime += " " + ((runtime_overrides or {}).get("openvino", {}).get("precision")
                              or params["runtime"]["openvino"]["precision"])
        label = (f"real planner ({runtime}), 1 process" if w == 0
                 else f"real planner ({runtime}), {w} Ray workers x {threads} thread")
        rows.append((label, w, *bench_planner(params, spec, clip_list, group, h_reuse, batch, w)))
    start_b, end_b = state_sizes(params, clip_list[0])
    info = machine_info()
    head = (f"machine: {info.cpu_model}, {info.logical_cpus} logical CPUs; load average {load0:.2f} before, "
            f"{os.getloadavg()[0]:.2f} after; {len(clip_list)} clips x G = {group}, H_reuse = {h_reuse}, "
            f"M = {candidates}, batch {batch}")
    lines = [head, "", "| setting | env steps | decisions | wall s | env steps/s | decisions/s |",
             "| --- | --- | --- | --- | --- | --- |"]
    for label, _, steps, decisions, secs in rows:
        lines.append(f"| {label} | {steps} | {decisions} | {secs:.1f} | {steps / secs:.0f} | "
                     f"{decisions / secs:.1f} |")
    lines += ["", f"pickled one-clip state: {start_b} bytes at the start, {end_b} bytes after "
                  f"{clip_list[0].num_steps - 1} steps ({clip_list[0].clip_id})"]
    return "\n".join(lines)
