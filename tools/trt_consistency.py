#!/usr/bin/env python3
"""Compare TensorRT engines with ONNX Runtime on recorded inputs (run this on the target with TensorRT).

Builds (or loads from the engine cache) TensorRT engines from the SAME ONNX files the onnxruntime backend
uses, runs every recorded graph call (an .npz written by tools/export_onnx.py --record) through both,
and prints the max absolute and relative error per graph output. Exit status 1 when an output exceeds
--atol/--rtol, 2 when TensorRT is not available here.

Example (on the vehicle computer):
    python tools/export_onnx.py --checkpoint checkpoints/rad2_il --record out/trt_inputs.npz
    python tools/trt_consistency.py --onnx-dir checkpoints/rad2_il/onnx --inputs out/trt_inputs.npz
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from pathlib import Path

import numpy as np


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--onnx-dir", required=True, help="directory with scene_encoder/denoiser/discriminator.onnx"
    )
    ap.add_argument("--inputs", required=True, help=".npz of recorded inputs (tools/export_onnx.py --record)")
    ap.add_argument("--fp32", action="store_true", help="build FP32 engines (default: runtime.tensorrt.fp16)")
    ap.add_argument("--atol", type=float, default=5e-2, help="max abs error allowed (FP16 default)")
    ap.add_argument("--rtol", type=float, default=5e-2, help="max relative error allowed")
    args = ap.parse_args(argv)

    from rad2_planner.config import load_params
    from rad2_planner.policy import resolve_path
    from rad2_planner.runtime.base import BackendUnavailableError
    from rad2_planner.runtime.onnx_export import GRAPHS
    from rad2_planner.runtime.ort_backend import OrtBackend
    from rad2_planner.runtime.trt_backend import TensorRTBackend

    params = load_params("planner")
    runtime = dict(params["runtime"])
    runtime["tensorrt"] = dict(runtime["tensorrt"])
    runtime["tensorrt"]["engine_cache_dir"] = str(resolve_path(runtime["tensorrt"]["engine_cache_dir"]))
    if args.fp32:
        runtime["tensorrt"]["fp16"] = False
    onnx_dir = Path(args.onnx_dir)
    paths = {g: onnx_dir / f"{g}.onnx" for g in GRAPHS}
    missing = [str(p) for p in paths.values() if not p.is_file()]
    if missing:
        ap.error(f"missing ONNX files: {missing}")
    data = np.load(args.inputs)
    calls: dict[tuple[str, int], dict[str, np.ndarray]] = defaultdict(dict)
    for key in data.files:
        g, i, name = key.split("/", 2)
        calls[(g, int(i))][name] = data[key]
    if not calls:
        ap.error(f"--inputs {args.inputs}: no recorded calls")
    ort = OrtBackend(paths, runtime)
    try:
        plan_points = next(v for (g, _), v in calls.items() if g == "denoiser")["x_t"].shape[2]
        trt = TensorRTBackend(paths, runtime, plan_points)
    except BackendUnavailableError as e:
        print(f"TensorRT unavailable: {e}")
        return 2
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
    print(f"{'output':<32} {'max abs':>10} {'max rel':>10}")
    failed = False
    for k, (ae, re) in worst.items():
        flag = "" if ae <= args.atol or re <= args.rtol else "  FAIL"
        failed |= bool(flag)
        print(f"{k:<32} {ae:10.3e} {re:10.3e}{flag}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
