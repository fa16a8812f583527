"""Compare TensorRT engines with ONNX Runtime on recorded inputs (run this on the target with TensorRT).

Builds (or loads from the engine cache) TensorRT engines from the SAME ONNX files the onnxruntime backend
uses, runs every recorded graph call (an .npz written by `rad2 export onnx --record`) through both,
and prints the max absolute and relative error per graph output. Exit status 1 when an output exceeds
--atol/--rtol, 2 when TensorRT is not available here.

examples (on the vehicle computer):
  rad2 export onnx --checkpoint checkpoints/rad2_il --record out/trt_inputs.npz
  rad2 eval consistency --onnx-dir checkpoints/rad2_il/onnx --inputs out/trt_inputs.npz
"""

from __future__ import annotations

from pathlib import Path

from rad2_bringup.cli.common import verb_parser


def main(argv: list[str]) -> int:
    from rad2_core.cli_args import float_in

    ap = verb_parser("eval consistency", __doc__)
    ap.add_argument(
        "--onnx-dir", required=True,
        help="directory with scene_encoder/denoiser/discriminator.onnx (and the generator graph of a "
             "recording made with runtime.fused_sampler)"
    )
    ap.add_argument("--inputs", required=True, help=".npz of recorded inputs (rad2 export onnx --record)")
    ap.add_argument("--fp32", action="store_true", help="build FP32 engines (default: runtime.tensorrt.fp16)")
    ap.add_argument("--atol", type=float_in(0.0, 10.0), default=5e-2,
                    help="max abs error allowed (FP16 default)")
    ap.add_argument("--rtol", type=float_in(0.0, 10.0), default=5e-2, help="max relative error allowed")
    args = ap.parse_args(argv)

    from rad2_core.config import load_params
    from rad2_planner.runtime.base import BackendUnavailableError
    from rad2_planner.runtime.consistency import (
        load_recorded_calls,
        recording_paths,
        tensorrt_runtime,
        trt_vs_ort,
    )

    runtime = tensorrt_runtime(load_params("planner"), args.fp32)
    if not Path(args.inputs).is_file():
        ap.error(f"--inputs {args.inputs}: no such file")
    try:
        paths = recording_paths(args.onnx_dir, args.inputs)
        calls = load_recorded_calls(args.inputs)
    except ValueError as e:
        ap.error(f"--inputs {e}")
    missing = [str(p) for p in paths.values() if not p.is_file()]
    if missing:
        ap.error(f"missing ONNX files: {missing}")
    if not calls:
        ap.error(f"--inputs {args.inputs}: no recorded calls")
    try:
        worst = trt_vs_ort(paths, runtime, calls)
    except BackendUnavailableError as e:
        print(f"TensorRT unavailable: {e}")
        return 2
    except ValueError as e:  # a recording without the denoising graphs' inputs
        ap.error(f"--inputs {args.inputs}: {e}")
    print(f"{'output':<32} {'max abs':>10} {'max rel':>10}")
    failed = False
    for k, (ae, re) in worst.items():
        flag = "" if ae <= args.atol or re <= args.rtol else "  FAIL"
        failed |= bool(flag)
        print(f"{k:<32} {ae:10.3e} {re:10.3e}{flag}")
    return 1 if failed else 0

