"""Backend consistency checks (tools/export_onnx.py, tools/trt_consistency.py): ONNX Runtime against
PyTorch on example inputs, recording the graph inputs of real planning cycles, and TensorRT engines
against ONNX Runtime on those recorded inputs. No ROS.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

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
    every graph call's inputs to ``path`` (the input of tools/trt_consistency.py)."""
    from rad2_planner.bev import snapshot_from_clip
    from rad2_planner.clip import iter_dataset
    from rad2_planner.config import resource_path
    from rad2_planner.observation import build_observation
    from rad2_planner.policy import Rad2Policy

    policy = Rad2Policy.from_params(
        params, checkpoint_dir=ckpt, backend="onnxruntime", onnx_dir=onnx_dir, always_score=True
    )
    rec = _recording_backend(policy.backend)
    n = 0
    for clip in iter_dataset(resource_path(data)):
        policy.plan(build_observation(snapshot_from_clip(clip, min(50, clip.num_steps - 1))))
        n += 1
        if n >= cycles:
            break
    flat = {}
    for g, calls in rec.items():
        for i, feed in enumerate(calls):
            for k, v in feed.items():
                flat[f"{g}/{i}/{k}"] = v
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(path, **flat)
    print(f"recorded {sum(len(c) for c in rec.values())} graph calls from {n} cycles -> {path}")


def _recording_backend(backend) -> dict[str, list[dict[str, np.ndarray]]]:
    """Wrap the backend's graph calls so each records its inputs; returns the lists they fill."""
    rec: dict[str, list[dict[str, np.ndarray]]] = {"scene_encoder": [], "denoiser": [], "discriminator": []}
    enc, den, sco = backend.encode, backend.denoise, backend.score_logits

    def r_enc(inputs):
        rec["scene_encoder"].append({k: np.array(v) for k, v in inputs.items()})
        return enc(inputs)

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
    return rec


def load_recorded_calls(path: str | Path) -> dict[tuple[str, int], dict[str, np.ndarray]]:
    """(graph, call index) -> feed, from a file of record_graph_inputs."""
    data = np.load(path)
    calls: dict[tuple[str, int], dict[str, np.ndarray]] = defaultdict(dict)
    for key in data.files:
        g, i, name = key.split("/", 2)
        calls[(g, int(i))][name] = data[key]
    return calls


def tensorrt_runtime(params: dict, fp32: bool = False) -> dict:
    """The planner's runtime settings with the engine cache resolved (and FP32 engines if asked)."""
    from rad2_planner.policy import resolve_path

    runtime = dict(params["runtime"])
    runtime["tensorrt"] = dict(runtime["tensorrt"])
    runtime["tensorrt"]["engine_cache_dir"] = str(resolve_path(runtime["tensorrt"]["engine_cache_dir"]))
    if fp32:
        runtime["tensorrt"]["fp16"] = False
    return runtime


def trt_vs_ort(paths: dict[str, Path], runtime: dict, calls: dict) -> dict[str, list[float]]:
    """Per graph output, the worst [abs, rel] error of TensorRT against ONNX Runtime over the recorded
    calls. BackendUnavailableError when TensorRT cannot be loaded."""
    from rad2_planner.runtime.ort_backend import OrtBackend
    from rad2_planner.runtime.trt_backend import TensorRTBackend

    ort = OrtBackend(paths, runtime)
    plan_points = next(v for (g, _), v in calls.items() if g == "denoiser")["x_t"].shape[2]
    trt = TensorRTBackend(paths, runtime, plan_points)
    worst: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for (g, _), feed in sorted(calls.items()):
        sess = ort.sessions[g]
        names = [o.name for o in sess.get_outputs()]
        ref = dict(zip(names, sess.run(None, feed)))
        eng = trt.engines[g]
        got = dict(zip(eng.outputs, eng.run(feed)))
        for n in names:
            a, b = ref[n].astype(np.float64), got[n].astype(np.float64)
            if n == "scene_bias":  # -1e4 padding bias: compare validity, not magnitude
                a, b = a < -1.0, b < -1.0
            abs_err = float(np.abs(a - b).max())
            rel_err = float((np.abs(a - b) / (np.abs(a) + 1e-3)).max())
            w = worst[f"{g}/{n}"]
            w[0], w[1] = max(w[0], abs_err), max(w[1], rel_err)
    return dict(worst)
