"""Backend consistency checks (rad2 export onnx, rad2 eval consistency): ONNX Runtime against
PyTorch on example inputs, recording the graph inputs of real planning cycles, and TensorRT engines
against ONNX Runtime on those recorded inputs. No ROS.

A recording holds the inputs of every graph call the planner made: the scene encoder and the
discriminator, and either the per-step denoiser (the step-by-step sampler) or, with
``runtime.fused_sampler`` true, the single-call generator graph, whose file name is recorded too.
``trt_vs_ort`` checks whichever of the two was recorded.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np


def ort_vs_torch(model, paths: dict[str, Path], runtime: dict) -> dict[str, float]:
    """Max abs error of every ONNX Runtime graph output against PyTorch on example inputs (B = 2, M = 16)."""
    import torch

    from rad2_planner.runtime.base import SCENE_INPUTS
    from rad2_planner.runtime.onnx_export import example_inputs
    from rad2_planner.runtime.ort_backend import OrtBackend
    from rad2_planner.runtime.torch_backend import TorchBackend

    torch.set_num_threads(1)
    pt, ox = TorchBackend(model), OrtBackend(paths, runtime)
    ex = example_inputs(model.cfg, batch=2, m=16, seed=0)
    inputs = {k: ex[k] for k in SCENE_INPUTS}
    s_pt, s_ox = pt.encode(inputs), ox.encode(inputs)
    errs = {f"scene_encoder/{k}": float(np.abs(v - s_ox[k]).max()) for k, v in pt.scene_outputs(s_pt).items()}
    errs["denoiser/x0"] = float(
        np.abs(pt.denoise(ex["x_t"], ex["t"], s_pt) - ox.denoise(ex["x_t"], ex["t"], s_ox)).max()
    )
    errs["discriminator/scores"] = float(
        np.abs(pt.score(ex["trajectories"], inputs, s_pt) - ox.score(ex["trajectories"], inputs, s_ox)).max()
    )
    return errs


def record_graph_inputs(params: dict, ckpt: Path, onnx_dir: Path, path: Path, data: str | Path,
                        cycles: int) -> None:
    """Run ``cycles`` planning cycles (one per clip of ``data``) with the ONNX Runtime backend and save
    every graph call's inputs to ``path`` (the input of rad2 eval consistency). ``params``: every file
    of params/ as loaded, merged."""
    from rad2_core.bev import snapshot_from_clip
    from rad2_core.config import resource_path
    from rad2_core.observation import build_observation
    from rad2_core.storage import iter_dataset

    from rad2_planner.policy import Rad2Policy

    policy = Rad2Policy.from_params(
        params, checkpoint_dir=ckpt, backend="onnxruntime", onnx_dir=onnx_dir, always_score=True
    )
    rec = _recording_backend(policy.backend)
    n = 0
    for clip in iter_dataset(resource_path(data)):
        snap = snapshot_from_clip(clip, min(50, clip.num_steps - 1), params, params)
        policy.plan(build_observation(snap, params=params))
        n += 1
        if n >= cycles:
            break
    save_recorded_calls(rec, path, policy.backend)
    print(f"recorded {sum(len(c) for c in rec.values())} graph calls from {n} cycles -> {path}")


def save_recorded_calls(rec: dict[str, list[dict[str, np.ndarray]]], path: Path, backend) -> None:
    """Write what ``_recording_backend`` recorded (``<graph>/<call>/<input>`` arrays), with the file name
    of the fused generator graph under ``generator_file`` when it ran."""
    flat = {}
    for g, calls in rec.items():
        for i, feed in enumerate(calls):
            for k, v in feed.items():
                flat[f"{g}/{i}/{k}"] = v
    if rec.get("generator"):
        flat["generator_file"] = np.array(Path(backend.paths["generator"]).name)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(path, **flat)


def _recording_backend(backend) -> dict[str, list[dict[str, np.ndarray]]]:
    """Wrap the backend's graph calls so each records its inputs; returns the lists they fill."""
    rec: dict[str, list[dict[str, np.ndarray]]] = {
        "scene_encoder": [], "denoiser": [], "generator": [], "discriminator": []}
    enc, den, sco = backend.encode, backend.denoise, backend.score_logits

    def r_enc(inputs, prefetch_scores=False):
        rec["scene_encoder"].append({k: np.array(v) for k, v in inputs.items()})
        return enc(inputs, prefetch_scores=prefetch_scores)

    def r_den(x, t, scene):
        rec["denoiser"].append(
            {
                "x_t": np.array(x),
                "t": np.array(t),
                "scene_tokens": scene["scene_tokens"],
                "scene_bias": scene["scene_bias"],
                "scene_cond": scene["scene_cond"],
            }
        )
        return den(x, t, scene)

    def r_sco(traj, inputs, scene):
        feed = {k: inputs[k] for k in ("map_polylines", "map_mask", "agents", "agents_mask", "ego_state")}
        rec["discriminator"].append(
            {"trajectories": np.array(traj, np.float32), **feed, "bev_tokens": scene["bev_tokens"]}
        )
        return sco(traj, inputs, scene)

    backend.encode, backend.denoise, backend.score_logits = r_enc, r_den, r_sco
    # The fused sampler (runtime.fused_sampler) runs all K steps in one call of the generator graph and
    # never calls denoise: record that graph's feed at its session (ONNX Runtime backend).
    gen = getattr(backend, "sessions", {}).get("generator")
    if gen is not None:
        gen_run = gen.run

        def r_gen(names, feed, *args, **kwargs):
            rec["generator"].append({k: np.array(v) for k, v in feed.items()})
            return gen_run(names, feed, *args, **kwargs)

        gen.run = r_gen
    return rec


def _open_recording(path: str | Path):
    """``np.load`` of a recording; ValueError naming the file when it is not an .npz of arrays."""
    try:
        return np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError) as exc:  # a pickle, a truncated or non-zip file
        raise ValueError(f"{path}: not a recording of rad2 export onnx --record "
                         f"({type(exc).__name__}: {exc})") from None


def load_recorded_calls(path: str | Path) -> dict[tuple[str, int], dict[str, np.ndarray]]:
    """(graph, call index) -> feed, from a file of record_graph_inputs (ValueError naming the file and
    the entry when it is not one)."""
    calls: dict[tuple[str, int], dict[str, np.ndarray]] = defaultdict(dict)
    with _open_recording(path) as data:
        for key in data.files:
            if key.count("/") < 2:  # generator_file
                continue
            g, i, name = key.split("/", 2)
            if not i.isdigit():
                raise ValueError(f"{path}: entry {key!r} is not <graph>/<call index>/<input>")
            try:
                calls[(g, int(i))][name] = data[key]
            except ValueError as exc:  # an object array
                raise ValueError(f"{path}: entry {key!r}: {exc}") from None
    return calls


def recording_paths(onnx_dir: str | Path, recording: str | Path) -> dict[str, Path]:
    """The ONNX files a recording is checked against: the three graphs of ``onnx_dir`` and, for a
    recording made with the fused sampler, the generator graph it names."""
    from rad2_planner.runtime.onnx_export import GRAPHS

    onnx_dir = Path(onnx_dir)
    paths = {g: onnx_dir / f"{g}.onnx" for g in GRAPHS}
    with _open_recording(recording) as data:
        if "generator_file" in data.files:
            paths["generator"] = onnx_dir / str(data["generator_file"])
    return paths


def check_recording(calls: dict[tuple[str, int], dict[str, np.ndarray]]) -> set[str]:
    """The graphs recorded; ValueError when the denoising part is missing: neither per-step denoiser
    calls nor fused generator calls (a recording made with runtime.fused_sampler true before the
    generator's inputs were recorded holds only the scene encoder and the discriminator)."""
    graphs = {g for g, _ in calls}
    if not graphs & {"denoiser", "generator"}:
        raise ValueError(
            f"the recording holds calls of {sorted(graphs)} only: no per-step denoiser and no fused "
            "generator inputs (recorded with runtime.fused_sampler true by an older recorder), so the "
            "denoising graphs cannot be checked; record again with rad2 export onnx --record")
    return graphs


def _plan_points(calls: dict[tuple[str, int], dict[str, np.ndarray]]) -> int:
    """T of the recorded trajectories ([B, M, T, 2]: denoiser x_t, generator x_init or the
    discriminator's trajectories)."""
    for _, feed in sorted(calls.items()):
        for name in ("x_t", "x_init", "trajectories"):
            if name in feed:
                return int(feed[name].shape[2])
    raise ValueError("the recording has no trajectory-shaped input (x_t, x_init or trajectories)")


def tensorrt_runtime(params: dict, fp32: bool = False) -> dict:
    """The planner's runtime settings with the engine cache resolved (and FP32 engines if asked)."""
    from rad2_planner.policy import resolve_path

    runtime = dict(params["runtime"])
    runtime["tensorrt"] = dict(runtime["tensorrt"])
    runtime["tensorrt"]["engine_cache_dir"] = str(resolve_path(runtime["tensorrt"]["engine_cache_dir"]))
    if fp32:
        runtime["tensorrt"]["fp16"] = False
    return runtime


def ort_runners(paths: dict[str, Path], runtime: dict) -> dict[str, Any]:
    """Graph -> ``feed -> {output name: array}`` on ONNX Runtime sessions of ``paths`` (the reference)."""
    import onnxruntime as ort

    from rad2_planner.runtime.ort_backend import _session_options

    out = {}
    for g, p in paths.items():
        sess = ort.InferenceSession(str(p), _session_options(ort, runtime),
                                    providers=["CPUExecutionProvider"])
        names = [o.name for o in sess.get_outputs()]
        out[g] = lambda feed, s=sess, n=names: dict(zip(n, s.run(None, feed)))
    return out


def trt_vs_ort(paths: dict[str, Path], runtime: dict, calls: dict) -> dict[str, list[float]]:
    """Per graph output, the worst [abs, rel] error of TensorRT against ONNX Runtime over the recorded
    calls: the scene encoder, the discriminator, and the per-step denoiser or the fused generator,
    whichever the recording holds (``check_recording``: ValueError when neither).
    BackendUnavailableError when TensorRT cannot be loaded."""
    from rad2_planner.runtime.onnx_export import GRAPHS
    from rad2_planner.runtime.trt_backend import TensorRTBackend

    graphs = check_recording(calls)
    if "generator" in graphs and "generator" not in paths:
        raise ValueError("the recording holds fused generator calls but names no generator graph "
                         "(generator_file); record again with rad2 export onnx --record")
    graph_paths = {g: paths[g] for g in graphs}
    trt = TensorRTBackend({g: paths[g] for g in GRAPHS}, runtime, _plan_points(calls))
    engines = {g: e for g, e in trt.engines.items() if g in graphs}
    if "generator" in graphs:  # all K steps in one graph: M is its dynamic axis, as the denoiser's
        engines["generator"] = trt.engine("generator", paths["generator"], ("x_init", 1))
    runners = {g: (lambda feed, e=e: dict(zip(e.outputs, e.run(feed)))) for g, e in engines.items()}
    return compare_calls(ort_runners(graph_paths, runtime), runners, calls)


def compare_calls(reference: dict[str, Any], candidate: dict[str, Any],
                  calls: dict) -> dict[str, list[float]]:
    """Per ``<graph>/<output>``, the worst [abs, rel] error of ``candidate`` against ``reference`` (each
    graph -> ``feed -> {output: array}``) over the recorded calls."""
    worst: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for (g, _), feed in sorted(calls.items()):
        ref = reference[g](feed)
        got = candidate[g](feed)
        for n in ref:
            a, b = ref[n].astype(np.float64), got[n].astype(np.float64)
            if n == "scene_bias":  # -1e4 padding bias: compare validity, not magnitude
                a, b = (a < -1.0).astype(np.float64), (b < -1.0).astype(np.float64)
            abs_err = float(np.abs(a - b).max())
            rel_err = float((np.abs(a - b) / (np.abs(a) + 1e-3)).max())
            w = worst[f"{g}/{n}"]
            w[0], w[1] = max(w[0], abs_err), max(w[1], rel_err)
    return dict(worst)
