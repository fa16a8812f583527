#!/usr/bin/env python3
"""Export a planner checkpoint to ONNX (scene encoder, one denoising step, discriminator) and check it.

Writes <out>/{scene_encoder,denoiser,discriminator}.onnx + manifest.json (dynamo export, dynamic B and M),
then compares ONNX Runtime with PyTorch on the same inputs and prints the max abs error per output.
--record FILE.npz also saves the exact inputs of each graph from a few real planning cycles, for
tools/trt_consistency.py on the target machine.

Example:
    .venv/bin/python tools/export_onnx.py --checkpoint checkpoints/rad2_il --record out/trt_inputs.npz
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", default=None, help="checkpoint dir (default: planner.checkpoint_dir)")
    ap.add_argument("--out", default=None, help="ONNX dir (default: <checkpoint>/onnx)")
    ap.add_argument("--force", action="store_true", help="re-export even if the cache matches the weights")
    ap.add_argument("--record", default=None, help="save recorded graph inputs to this .npz")
    ap.add_argument("--data", default="data/eval_efficiency", help="dataset for recorded observations")
    ap.add_argument("--cycles", type=int, default=4, help="planning cycles to record")
    args = ap.parse_args(argv)

    import torch
    from rad2_planner.config import load_params
    from rad2_planner.networks import PlannerModel
    from rad2_planner.policy import Rad2Policy, resolve_path
    from rad2_planner.runtime.base import SCENE_INPUTS
    from rad2_planner.runtime.onnx_export import ensure_onnx, example_inputs, export_onnx
    from rad2_planner.runtime.ort_backend import OrtBackend
    from rad2_planner.runtime.torch_backend import TorchBackend

    params = load_params("planner")
    ckpt = resolve_path(args.checkpoint or params["planner"]["checkpoint_dir"])
    out = Path(args.out) if args.out else ckpt / "onnx"
    model = PlannerModel.load(ckpt)
    paths = export_onnx(model, out) if args.force else ensure_onnx(model, out)
    for g, p in paths.items():
        print(f"{g:<14} {p}  {p.stat().st_size / 1e6:.2f} MB")
    torch.set_num_threads(1)
    pt, ox = TorchBackend(model), OrtBackend(paths, params["runtime"])
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
    print("ONNX Runtime vs PyTorch, max abs error:")
    for k, v in errs.items():
        print(f"  {k:<28} {v:.2e}")
    bad = {k: v for k, v in errs.items() if v > 1e-4}
    if args.record:
        _record(args, params, ckpt, out, Path(args.record), Rad2Policy)
    if bad:
        print(f"FAILED: errors above 1e-4: {bad}")
        return 1
    return 0


def _record(args, params, ckpt, onnx_dir, path: Path, policy_cls) -> None:
    """Run a few cycles with the ONNX Runtime backend and save every graph call's inputs."""
    from rad2_planner.bev import snapshot_from_clip
    from rad2_planner.clip import iter_dataset
    from rad2_planner.observation import build_observation

    policy = policy_cls.from_params(
        params, checkpoint_dir=ckpt, backend="onnxruntime", onnx_dir=onnx_dir, always_score=True
    )
    backend = policy.backend
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
    n = 0
    for clip in iter_dataset(ROOT / args.data):
        policy.plan(build_observation(snapshot_from_clip(clip, min(50, clip.num_steps - 1))))
        n += 1
        if n >= args.cycles:
            break
    flat = {}
    for g, calls in rec.items():
        for i, feed in enumerate(calls):
            for k, v in feed.items():
                flat[f"{g}/{i}/{k}"] = v
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(path, **flat)
    print(f"recorded {sum(len(c) for c in rec.values())} graph calls from {n} cycles -> {path}")


if __name__ == "__main__":
    raise SystemExit(main())
