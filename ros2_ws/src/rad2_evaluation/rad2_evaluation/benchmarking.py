"""What every benchmark reports beside its timings, so that its figures can be reproduced and judged.

A latency on a shared 2-core cloud machine means little alone: the same code measured 1.4-1.8x apart
between hours. Each benchmark therefore prints the machine (CPU model, logical CPUs, threads used), the
1-minute load before and after, and an efficiency ratio measured in the same run: the time of a
stage divided by its FLOP floor, the time the stage's floating-point work would take at the
throughput that large matrix products reach on this machine right now (:func:`matmul_probe`).
A ratio near 1 means the stage is as fast as this CPU allows; it is comparable across machines
and loads where the milliseconds are not.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from rad2_core.machine import MachineInfo, hardware_record, load_average, machine_info  # noqa: F401


def _best_seconds(fn, seconds: float, sync=lambda: None) -> float:
    """Shortest time of ``fn`` over repeats for ``seconds`` (after 3 warm-up calls), 4 calls a repeat."""
    for _ in range(3):
        fn()
    sync()
    best = float("inf")
    t_end = time.perf_counter() + seconds
    while time.perf_counter() < t_end:
        t0 = time.perf_counter()
        for _ in range(4):
            fn()
        sync()
        best = min(best, (time.perf_counter() - t0) / 4)
    return best


def _torch_matmul_seconds(threads: int, size: int, seconds: float, device: str) -> float:
    import torch

    cuda = str(device).startswith("cuda")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    before = torch.get_num_threads()
    torch.set_num_threads(int(threads))
    try:
        a = torch.rand(size, size, device=device)
        b = torch.rand(size, size, device=device)
        return _best_seconds(lambda: a @ b, seconds, sync)
    finally:
        torch.set_num_threads(before)


def _onednn_linear_seconds(threads: int, size: int, seconds: float) -> float | None:
    """The same product through oneDNN (PyTorch's ``mkldnn`` linear on blocked tensors), the other
    kernel library in the torch wheel; ``None`` where this build has no oneDNN."""
    import torch

    if not torch.backends.mkldnn.is_available():
        return None
    import warnings

    before = torch.get_num_threads()
    torch.set_num_threads(int(threads))
    try:
        with torch.no_grad(), warnings.catch_warnings():
            # torch.utils.mkldnn's modules still use torch.jit.script_method, which warns on use
            warnings.simplefilter("ignore", DeprecationWarning)
            from torch.utils import mkldnn

            layer = mkldnn.to_mkldnn(torch.nn.Linear(size, size, bias=False))
            x = torch.rand(size, size).to_mkldnn()
            return _best_seconds(lambda: layer(x), seconds)
    finally:
        torch.set_num_threads(before)


def _ort_matmul_seconds(threads: int, size: int, seconds: float) -> float:
    """The same product as one ONNX ``MatMul`` run by ONNX Runtime's CPU provider (its MLAS kernels,
    the ones the planner's ONNX graphs run on)."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    def value(name):
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, [size, size])

    graph = helper.make_graph([helper.make_node("MatMul", ["a", "b"], ["c"])], "matmul_probe",
                              [value("a"), value("b")], [value("c")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8  # readable by every ONNX Runtime the project supports
    so = ort.SessionOptions()
    so.intra_op_num_threads = int(threads)
    so.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    feed = {k: rng.random((size, size), dtype=np.float32) for k in ("a", "b")}
    return _best_seconds(lambda: session.run(None, feed), seconds)


def matmul_probes(threads: int, size: int = 1024, seconds: float = 1.0,
                  device: str = "cpu") -> dict[str, float]:
    """GFLOP/s of float32 ``size x size`` matrix products on ``threads`` threads (best of repeats) per
    kernel library: ``torch`` (``torch.matmul``: MKL in the CPU wheel), ``onednn`` (the wheel's oneDNN,
    where built in) and ``onnxruntime`` (MLAS, what the planner's ONNX graphs run on), or on a CUDA
    ``device`` PyTorch alone (4096 x 4096, with PyTorch's default float32 precision, as the planner).

    Every CPU library is probed because their speed depends on the CPU vendor: on a 2-vCPU AMD EPYC
    (Zen 5), MKL reached 190 GFLOP/s, MLAS about 400 and oneDNN about 455 on the same two threads,
    so a floor taken from one library alone can be less than half of what the machine does. The best
    repeat is taken because the floor is what the machine can do, not what a busy moment allowed.
    """
    cuda = str(device).startswith("cuda")
    size = 4096 if cuda and size == 1024 else size
    flop = 2.0 * size**3
    out = {"torch": flop / _torch_matmul_seconds(threads, size, seconds, device) / 1e9}
    if not cuda:
        onednn = _onednn_linear_seconds(threads, size, seconds)
        if onednn is not None:
            out["onednn"] = flop / onednn / 1e9
        out["onnxruntime"] = flop / _ort_matmul_seconds(threads, size, seconds) / 1e9
    return out


def matmul_probe(threads: int, size: int = 1024, seconds: float = 1.0, device: str = "cpu") -> float:
    """The fastest of :func:`matmul_probes` (GFLOP/s): the throughput the FLOP floors are taken at."""
    return max(matmul_probes(threads, size, seconds, device).values())


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
    from rad2_planner.diffusion import SamplerSpec
    from rad2_planner.networks.sampler import DiffusionSampler
    from rad2_planner.runtime.base import DISCRIMINATOR_INPUTS, SCENE_INPUTS
    from rad2_planner.runtime.onnx_export import example_inputs

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
    #: GFLOP/s per kernel library (:func:`matmul_probes`); ``probe_gflops`` is the largest
    probe_by_library: dict[str, float] | None = None

    @classmethod
    def start(cls, threads: int, probe: bool = True, device: str = "cpu") -> RunContext:
        load = load_average()
        by_library = matmul_probes(threads, device=device) if probe else None
        gflops = max(by_library.values()) if by_library else float("nan")
        return cls(machine_info(), int(threads), load, gflops, gpu=gpu_name(device),
                   probe_by_library=by_library)

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
            + (f" (best of {probe_libraries(self.probe_by_library)})" if self.probe_by_library else "")
        )

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["machine"] = asdict(self.machine)
        return d


def probe_libraries(by_library: dict[str, float] | None) -> str:
    """``"torch 187, onnxruntime 392 GFLOP/s"`` (empty without a per-library probe)."""
    if not by_library:
        return ""
    return ", ".join(f"{name} {g:.0f}" for name, g in by_library.items()) + " GFLOP/s"


#: 1-minute load average above which bench_all marks a figure as taken on a busy machine
LOAD_LIMIT = 1.2


def _load_flag(before: float, after: float) -> str:
    worst = max(before, after)
    return f"{before:.2f} / {after:.2f}" + (" ⚠" if worst > LOAD_LIMIT else "")


def print_graph_results(res: dict[str, Any]) -> None:
    """The console table of rad2 bench graph (rad2_bringup.graph_bench)."""
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
    """Histogram of input -> trajectory (rad2 bench graph)."""
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
    """The markdown summary of rad2 bench all from the JSON its benchmarks wrote into ``out``
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
        f"{run['threads']} threads"
        + (f" (best of {probe_libraries(run['probe_by_library'])})" if run.get("probe_by_library") else "")
        + ". Load: 1-minute load average before / after each benchmark "
        f"(⚠ above {LOAD_LIMIT}: busy machine, figures not comparable).",
        "",
        "| benchmark | figure | median | p99 | target | load |",
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
    for precision in ("f32", "bf16"):  # rad2 bench all --openvino
        path = out / f"planner_openvino_{precision}.json"
        if not path.is_file():
            continue
        other = json.loads(path.read_text())
        orun = other["meta"]["run"]
        oload = _load_flag(orun["load_before"], orun["load_after"])
        ran = other["meta"].get("precision", precision)  # what was compiled: f32 on a CPU without bf16
        label = precision if ran == precision else f"{precision} asked, {ran} ran"
        for m, res in other["results"].items():
            lines.append(f"| planning cycle, OpenVINO {label}, {orun['threads']} threads, M = {m} | ms | "
                         f"{res['total']['median']:.1f} | {res['total']['p99']:.1f} | | {oload} |")
            lines.append(f"| … denoise_total | ms | {res['denoise_total']['median']:.2f} | "
                         f"{res['denoise_total']['p99']:.2f} | | |")
            lines.append(f"| … cycle / FP32 FLOP floor (floor {res['floor_ms']:.1f} ms) | ratio | "
                         f"{res['efficiency']['median']:.2f} | {res['efficiency']['p99']:.2f} | | |")
    for m, res in planner["selection"].items():
        bar = "≤ 1 ms" if m == "32" else "≤ 3 ms"
        agents = planner["meta"]["selection_agents"]
        lines.append(f"| selection alone (safe_medoid, {agents} agents), M = {m} | ms | "
                     f"{res['median']:.2f} | {res['p99']:.2f} | {bar} | {load} |")
    ops_json = out / "planner_ops.json"
    if ops_json.is_file():
        ops = json.loads(ops_json.read_text())
        prof, orun = ops["profile"], ops["run"]
        per_thread = orun["probe_gflops"] / max(int(orun["threads"]), 1)
        share = prof["other_ms_per_cycle"] / prof["kernel_ms_per_cycle"]
        oload = _load_flag(orun["load_before"], orun["load_after"])
        lines.append(f"| operator profile, M = {ops['num_candidates']}: matrix products "
                     f"({prof['matrix']['gflop_per_cycle']:.2f} GFLOP) | GFLOP/s per thread | "
                     f"{prof['matrix']['gflops_per_thread']:.0f} (probe {per_thread:.0f}) | | | {oload} |")
        lines.append(f"| … every other operator | share of kernel time | {100 * share:.0f} % | | | |")
        if "cycle_ms" in prof:  # what the profiler itself costs (alternated cycles with and without it)
            cyc = prof["cycle_ms"]
            lines.append(f"| … cycle with / without the profiler (its per-operator cost inflates small "
                         f"operators) | ms | {cyc['profiled']['median']:.1f} / {cyc['plain']['median']:.1f} "
                         f"| | | |")
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
        for stage, bar in (("validate_output", ""), ("publish", "median ≤ 1 ms")):
            q = graph.get("stages_ms", {}).get(stage)
            if q:  # the node's own stage timings of the same cycles
                lines.append(f"| … {stage} (in the node) | ms | {q['median']:.2f} | {q['p99']:.2f} | "
                             f"{bar} | |")
    if include_rollouts:
        lines += ["", (out / "rollouts.md").read_text()]
    lines += ["", f"GPU: none on this machine ({os.cpu_count()} CPUs); CUDA figures need a CUDA machine.", ""]
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------------
# where a network's time goes: ONNX Runtime's operator profile

#: operators whose FLOPs the profile can count from their shapes (2 per multiply-add)
MATRIX_OPS = ("Gemm", "MatMul", "FusedMatMul")


def _matrix_flops(op: str, args: dict[str, Any]) -> float:
    """FLOPs of one matrix-product kernel from the shapes ONNX Runtime records: output ``[..., M, N]``
    and first input ``[..., M, K]`` (the exporter writes no transposed ``A``); weights stored in the
    graph are not listed, so only the first input is used."""
    try:
        a = next(iter(args["input_type_shape"][0].values()))
        out = next(iter(args["output_type_shape"][0].values()))
    except (KeyError, IndexError, StopIteration):
        return 0.0
    if op not in MATRIX_OPS or not a or not out:
        return 0.0
    return 2.0 * float(np.prod(out)) * float(a[-1])


def _graph_of(trace: Path) -> str:
    """``<prefix><graph>_<n>_<date>.json`` (runtime/ort_backend._session_options) -> ``<graph>``."""
    import re

    m = re.match(r"(.+)_\d+_\d{4}-\d\d-\d\d_", trace.name)
    return m.group(1) if m else trace.stem


def operator_profile(traces, cycles: int) -> dict[str, Any]:
    """Kernel time per graph and operator type, per planning cycle, from ONNX Runtime's profile files
    (``runtime.ort_profile_prefix``).

    Each session's first run is left out (the warm-up call, which allocates). Times are thread-time:
    calls that run side by side (candidate shards) add up. Matrix products also get their FLOPs
    (:data:`MATRIX_OPS`), so their throughput can be set against the probe: what separates a cycle from
    its FLOP floor is then read off as the time of everything else.
    """
    import json
    from collections import defaultdict

    per_graph: dict[str, dict[str, dict[str, float]]] = defaultdict(
        lambda: defaultdict(lambda: {"us": 0.0, "calls": 0, "flop": 0.0}))
    runs: dict[str, int] = defaultdict(int)
    for trace in map(Path, traces):
        events = json.loads(trace.read_text())
        graph = _graph_of(trace)
        model_runs = sorted((e for e in events if e.get("name") == "model_run"), key=lambda e: e["ts"])
        if not model_runs:
            continue
        warm_end = model_runs[0]["ts"] + model_runs[0]["dur"]
        runs[graph] += len(model_runs) - 1
        for e in events:
            if e.get("cat") != "Node" or not str(e.get("name", "")).endswith("_kernel_time"):
                continue
            if e["ts"] < warm_end:
                continue
            op = e.get("args", {}).get("op_name", "?")
            row = per_graph[graph][op]
            row["us"] += float(e["dur"])
            row["calls"] += 1
            row["flop"] += _matrix_flops(op, e.get("args", {}))
    cycles = max(int(cycles), 1)
    graphs: dict[str, Any] = {}
    matrix_ms = matrix_gflop = other_ms = 0.0
    for graph, ops in per_graph.items():
        rows = {op: {"ms_per_cycle": v["us"] / 1e3 / cycles, "calls_per_cycle": v["calls"] / cycles,
                     "gflop_per_cycle": v["flop"] / 1e9 / cycles} for op, v in ops.items()}
        graphs[graph] = {"runs": runs[graph], "ms_per_cycle": sum(r["ms_per_cycle"] for r in rows.values()),
                         "ops": dict(sorted(rows.items(), key=lambda kv: -kv[1]["ms_per_cycle"]))}
        for op, r in rows.items():
            if op in MATRIX_OPS:
                matrix_ms += r["ms_per_cycle"]
                matrix_gflop += r["gflop_per_cycle"]
            else:
                other_ms += r["ms_per_cycle"]
    return {
        "cycles": cycles,
        "graphs": dict(sorted(graphs.items(), key=lambda kv: -kv[1]["ms_per_cycle"])),
        "matrix": {"ms_per_cycle": matrix_ms, "gflop_per_cycle": matrix_gflop,
                   "gflops_per_thread": matrix_gflop / (matrix_ms / 1e3) if matrix_ms else float("nan")},
        "other_ms_per_cycle": other_ms,
        "kernel_ms_per_cycle": matrix_ms + other_ms,
    }


def print_operator_profile(profile: dict[str, Any], probe_gflops: float, threads: int, top: int = 8) -> None:
    """The console table of :func:`operator_profile`."""
    total = profile["kernel_ms_per_cycle"] or float("nan")
    print(f"operator profile: kernel thread-ms per cycle over {profile['cycles']} cycles (ONNX Runtime)")
    print(f"{'graph':<22} {'operator':<22} {'ms':>7} {'share':>6} {'calls':>6} {'GFLOP/s':>8}")
    for graph, g in profile["graphs"].items():
        print(f"{graph:<22} {'(all)':<22} {g['ms_per_cycle']:7.2f} {100 * g['ms_per_cycle'] / total:5.1f}%")
        for op, r in list(g["ops"].items())[:top]:
            rate = r["gflop_per_cycle"] / (r["ms_per_cycle"] / 1e3) if r["gflop_per_cycle"] else float("nan")
            rate_s = f"{rate:8.0f}" if rate == rate else f"{'':8s}"
            print(f"{'':<22} {op:<22} {r['ms_per_cycle']:7.2f} {100 * r['ms_per_cycle'] / total:5.1f}% "
                  f"{r['calls_per_cycle']:6.0f} {rate_s}")
    mat = profile["matrix"]
    per_thread = probe_gflops / max(int(threads), 1)
    print(f"matrix products ({', '.join(MATRIX_OPS)}): {mat['ms_per_cycle']:.2f} thread-ms per cycle, "
          f"{mat['gflop_per_cycle']:.2f} GFLOP, {mat['gflops_per_thread']:.0f} GFLOP/s per thread "
          f"(probe {per_thread:.0f} per thread, {100 * mat['gflops_per_thread'] / per_thread:.0f} %)")
    print(f"every other operator: {profile['other_ms_per_cycle']:.2f} thread-ms per cycle "
          f"({100 * profile['other_ms_per_cycle'] / total:.0f} % of the kernel time)")
