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


def matmul_probe(threads: int, size: int = 1024, seconds: float = 1.0) -> float:
    """GFLOP/s of float32 ``size x size`` matrix products on ``threads`` threads (best of repeats).

    ONNX Runtime's MLAS and PyTorch's kernels reach about this on the large products of a network;
    the best repeat is taken because the floor is what the machine can do, not what a busy moment
    allowed.
    """
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(int(threads))
    try:
        a = torch.rand(size, size)
        b = torch.rand(size, size)
        for _ in range(3):
            a @ b
        best = float("inf")
        t_end = time.perf_counter() + seconds
        while time.perf_counter() < t_end:
            t0 = time.perf_counter()
            for _ in range(4):
                a @ b
            best = min(best, (time.perf_counter() - t0) / 4)
    finally:
        torch.set_num_threads(before)
    return 2.0 * size**3 / best / 1e9


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
    ex = {k: torch.from_numpy(v) for k, v in example_inputs(cfg, batch=batch, m=num_candidates).items()}
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

    @classmethod
    def start(cls, threads: int, probe: bool = True) -> RunContext:
        load = load_average()
        return cls(machine_info(), int(threads), load, matmul_probe(threads) if probe else float("nan"))

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
            f"{self.probe_gflops:.0f} GFLOP/s on {self.threads} thread(s)"
        )

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["machine"] = asdict(self.machine)
        return d
