"""What every benchmark reports beside its timings, so that its figures can be reproduced and judged.

A latency on a shared 2-core VM means little alone: the same code measured 1.4-1.8x apart between
sessions. Each benchmark therefore prints the machine (CPU model, logical CPUs, threads used), the
1-minute load before and after, and an efficiency ratio measured in the same run: the time of a
stage divided by its FLOP floor, the time the stage's floating-point work would take at the
throughput that large matrix products reach on this machine right now (:func:`matmul_probe`).
A ratio near 1 means the stage is as fast as this CPU allows; it is comparable across machines
and loads where the milliseconds are not.
"""

from __future__ import annotations

import os
import platform
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np


@dataclass(frozen=True)
class MachineInfo:
    cpu_model: str
    logical_cpus: int
    python: str
    numpy_blas: str

    def describe(self) -> str:
        return f"{self.cpu_model}, {self.logical_cpus} logical CPUs, Python {self.python}"


def machine_info() -> MachineInfo:
    model = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    try:
        blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]["name"]  # numpy >= 1.26
    except Exception:  # noqa: BLE001 -- informational only
        blas = "?"
    return MachineInfo(model, os.cpu_count() or 1, platform.python_version(), str(blas))


def hardware_record() -> dict[str, Any]:
    """What figures were measured on, as a JSON-able dict (CPU model, logical CPUs, the three load
    averages now, Python, platform): the record training and evaluation reports keep."""
    info = machine_info()
    return {
        "cpu": info.cpu_model,
        "logical_cpus": info.logical_cpus,
        "load_average": list(os.getloadavg()),
        "python": info.python,
        "platform": platform.platform(),
    }


def load_average() -> float:
    """1-minute load average (NaN where the OS has none)."""
    try:
        return float(os.getloadavg()[0])
    except (AttributeError, OSError):
        return float("nan")


def matmul_probe(threads: int, size: int = 1024, seconds: float = 1.0, device: str = "cpu") -> float:
    """GFLOP/s of float32 ``size x size`` matrix products on ``threads`` threads (best of repeats),
    or on a CUDA ``device`` (4096 x 4096, with PyTorch's default float32 precision, as the planner).

    ONNX Runtime's MLAS and PyTorch's kernels reach about this on the large products of a network;
    the best repeat is taken because the floor is what the machine can do, not what a busy moment
    allowed.
    """
    import torch

    cuda = str(device).startswith("cuda")
    size = 4096 if cuda and size == 1024 else size
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    before = torch.get_num_threads()
    torch.set_num_threads(int(threads))
    try:
        a = torch.rand(size, size, device=device)
        b = torch.rand(size, size, device=device)
        for _ in range(3):
            a @ b
        sync()
        best = float("inf")
        t_end = time.perf_counter() + seconds
        while time.perf_counter() < t_end:
            t0 = time.perf_counter()
            for _ in range(4):
                a @ b
            sync()
            best = min(best, (time.perf_counter() - t0) / 4)
    finally:
        torch.set_num_threads(before)
    return 2.0 * size**3 / best / 1e9


def gpu_name(device: str) -> str | None:
    """The CUDA device's name (``None`` for a CPU device)."""
    if not str(device).startswith("cuda"):
        return None
    import torch

    return torch.cuda.get_device_name(torch.device(device))


def count_flops(fn, *args, **kwargs) -> float:
    """Floating-point operations (2 per multiply-add) of one call of a PyTorch function."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with torch.inference_mode(), counter:
        fn(*args, **kwargs)
    return float(counter.get_total_flops())


def planning_cycle_flops(model, num_candidates: int, num_steps: int, batch: int = 1) -> dict[str, float]:
    """FLOPs of the networks of one planning cycle: encoder, K denoising steps (the single-call
    sampler, scene keys/values projected once) and the discriminator over M candidates."""
    import torch

    from .diffusion import SamplerSpec
    from .networks.sampler import DiffusionSampler
    from .runtime.base import DISCRIMINATOR_INPUTS, SCENE_INPUTS
    from .runtime.onnx_export import example_inputs

    cfg = model.cfg
    device = next(model.parameters()).device
    ex = {k: torch.from_numpy(v).to(device)
          for k, v in example_inputs(cfg, batch=batch, m=num_candidates).items()}
    scene_args = [ex[k] for k in SCENE_INPUTS]
    with torch.inference_mode():
        tokens, bias, cond, bev_tokens = model.encoder(*scene_args)
    sampler = DiffusionSampler(model.denoiser, cfg.num_train_steps, SamplerSpec(num_steps, "ddim", None))
    disc_args = [ex[k] for k in DISCRIMINATOR_INPUTS[:-1]] + [bev_tokens]
    out = {
        "encode": count_flops(model.encoder, *scene_args),
        "generate": count_flops(sampler, ex["x_t"], tokens, bias, cond),
        "score": count_flops(model.discriminator.logits_and_scores, *disc_args),
    }
    out["total"] = sum(out.values())
    return out


def percentiles(values) -> dict[str, float]:
    v = np.asarray(values, dtype=np.float64)
    return {
        "median": float(np.median(v)),
        "p90": float(np.percentile(v, 90)),
        "p99": float(np.percentile(v, 99)),
        "max": float(v.max()),
    }


@dataclass
class RunContext:
    """Machine, threads, load before/after and the matrix-product probe of one benchmark run."""

    machine: MachineInfo
    threads: int
    load_before: float
    probe_gflops: float
    load_after: float = float("nan")
    #: the GPU that ran the networks (its name), ``None`` on the CPU; the probe then ran on it
    gpu: str | None = None

    @classmethod
    def start(cls, threads: int, probe: bool = True, device: str = "cpu") -> RunContext:
        load = load_average()
        gflops = matmul_probe(threads, device=device) if probe else float("nan")
        return cls(machine_info(), int(threads), load, gflops, gpu=gpu_name(device))

    def finish(self) -> RunContext:
        self.load_after = load_average()
        return self

    def floor_ms(self, flops: float) -> float:
        """Time of ``flops`` at the probed throughput (ms)."""
        return flops / (self.probe_gflops * 1e9) * 1e3

    def header(self) -> str:
        return (
            f"machine: {self.machine.describe()}; threads {self.threads}; load average "
            f"{self.load_before:.2f} before, {self.load_after:.2f} after; matrix-product probe "
            f"{self.probe_gflops:.0f} GFLOP/s on "
            + (f"the GPU {self.gpu}" if self.gpu else f"{self.threads} thread(s)")
        )

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["machine"] = asdict(self.machine)
        return d


#: 1-minute load average above which bench_all marks a figure as taken on a busy machine
LOAD_LIMIT = 1.2


def _load_flag(before: float, after: float) -> str:
    worst = max(before, after)
    return f"{before:.2f} / {after:.2f}" + (" ⚠" if worst > LOAD_LIMIT else "")


def print_graph_results(res: dict[str, Any]) -> None:
    """The console table of tools/bench_graph.py (rad2_planner.nodes.graph_bench)."""
    meta, run = res["meta"], res["meta"]["run"]
    print(f"planner node in a ROS 2 graph: {meta['checkpoint']}, M = {meta['num_candidates']}, inputs from "
          f"{meta['data']} at {meta['rate_hz']:g} Hz, recorder subscribed: {meta['subscribe_all']}")
    print(f"machine: {run['machine']['cpu_model']}, {run['machine']['logical_cpus']} logical CPUs; load "
          f"{run['load_before']:.2f} before, {run['load_after']:.2f} after")
    print(f"cycles: {res['sent']} sent, {res['planned']} trajectories received, {res['fallbacks']} "
          f"fallbacks, {res['deadline_misses']} over the deadline")
    rows = [("input -> trajectory", res["input_to_trajectory_ms"])] + list(res["stages_ms"].items())
    print(f"{'ms':28s} {'median':>8s} {'p90':>8s} {'p99':>8s} {'max':>8s}")
    for name, p in rows:
        if p:
            print(f"{name:28s} {p['median']:8.2f} {p['p90']:8.2f} {p['p99']:8.2f} {p['max']:8.2f}")


def plot_graph_results(res: dict[str, Any], png: str) -> None:
    """Histogram of input -> trajectory (tools/bench_graph.py)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lat = res.get("latency_samples_ms") or []
    fig, ax = plt.subplots(figsize=(6, 3.5))
    if lat:
        ax.hist(lat, bins=40, color="tab:blue")
        p = res["input_to_trajectory_ms"]
        for q, style in (("median", "-"), ("p99", "--")):
            ax.axvline(p[q], color="k", ls=style, label=f"{q} {p[q]:.1f} ms")
        ax.legend()
    ax.set_xlabel("input stamp -> trajectory arrival (ms)")
    ax.set_ylabel("cycles")
    meta = res["meta"]
    ax.set_title(f"planner node over DDS, M = {meta['num_candidates']}, load "
                 f"{meta['load_avg'][0]:.2f}/{meta['load_avg'][1]:.2f}", fontsize=9)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


def bench_summary(out: Path, include_rollouts: bool = False, elapsed_s: float = float("nan")) -> str:
    """The markdown summary of tools/bench_all.py from the JSON its benchmarks wrote into ``out``
    (planner.json, ilqr.json, warp.json, graph.json and, with ``include_rollouts``, rollouts.md)."""
    import json

    out = Path(out)
    planner = json.loads((out / "planner.json").read_text())
    ilqr = json.loads((out / "ilqr.json").read_text())
    warp = json.loads((out / "warp.json").read_text())
    run = planner["meta"]["run"]
    machine = machine_info()
    lines = [
        f"# Benchmarks ({time.strftime('%Y-%m-%d %H:%M')}, {elapsed_s:.0f} s)",
        "",
        f"Machine: {machine.describe()}. Matrix-product probe: {run['probe_gflops']:.0f} GFLOP/s on "
        f"{run['threads']} threads. Load: 1-minute load average before / after each benchmark "
        f"(⚠ above {LOAD_LIMIT}: busy machine, figures not comparable).",
        "",
        "| benchmark | figure | median | p99 | bar | load |",
        "|---|---|---|---|---|---|",
    ]
    load = _load_flag(run["load_before"], run["load_after"])
    for m, res in planner["results"].items():
        bar = "p99 ≤ 20 ms" if m == "32" else ""
        lines.append(f"| planning cycle, ORT {run['threads']} threads, M = {m} | ms | "
                     f"{res['total']['median']:.1f} | {res['total']['p99']:.1f} | {bar} | {load} |")
        for stage in ("encode", "denoise_total", "score", "select"):
            lines.append(f"| … {stage} | ms | {res[stage]['median']:.2f} | {res[stage]['p99']:.2f} | | |")
        lines.append(f"| … cycle / FLOP floor ({res['gflop']['total']:.2f} GFLOP, "
                     f"floor {res['floor_ms']:.1f} ms) | ratio | {res['efficiency']['median']:.2f} | "
                     f"{res['efficiency']['p99']:.2f} | {'≤ 1.6' if m == '32' else ''} | |")
    for m, res in planner["selection"].items():
        bar = "≤ 1 ms" if m == "32" else "≤ 3 ms"
        agents = planner["meta"]["selection_agents"]
        lines.append(f"| selection alone (safe_medoid, {agents} agents), M = {m} | ms | "
                     f"{res['median']:.2f} | {res['p99']:.2f} | {bar} | {load} |")
    iload = _load_flag(ilqr["load_before"], ilqr["load_after"])
    for row in ilqr["rows"]:
        lines.append(f"| {row['name']} ({ilqr['kernel']} kernel) | ms | {row['median_ms']:.2f} | "
                     f"{row['p99_ms']:.2f} | | {iload} |")
    wload = _load_flag(warp["load_before"], warp["load_after"])
    for row in warp["warp"]:
        lines.append(f"| BEV warp, {row['backend']}, batch {row['batch']} | ms/frame | "
                     f"{row['ms_per_frame']:.3f} | | | {wload} |")
    graph_json = out / "graph.json"
    if graph_json.is_file():
        graph = json.loads(graph_json.read_text())
        p = graph["input_to_trajectory_ms"]
        gload = _load_flag(*graph["meta"]["load_avg"])
        who = "recorder subscribed" if graph["meta"]["subscribe_all"] else "no recorder"
        lines.append(f"| ROS graph: input → trajectory, planner node over DDS, M = "
                     f"{graph['meta']['num_candidates']} ({graph['planned']} cycles, {who}, "
                     f"{graph['fallbacks']} fallbacks) | ms | {p['median']:.1f} | {p['p99']:.1f} | "
                     f"p99 ≤ 60 ms | {gload} |")
    if include_rollouts:
        lines += ["", (out / "rollouts.md").read_text()]
    lines += ["", f"GPU: none on this machine ({os.cpu_count()} CPUs); CUDA figures need a lent device.", ""]
    return "\n".join(lines)
