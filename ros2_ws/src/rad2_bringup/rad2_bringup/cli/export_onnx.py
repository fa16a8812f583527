"""Export a planner checkpoint to ONNX (scene encoder, one denoising step, discriminator) and check it.

Writes <out>/{scene_encoder,denoiser,discriminator}.onnx + manifest.json (dynamic B and M),
then compares ONNX Runtime with PyTorch on the same inputs and prints the max abs error per output.
--record FILE.npz also saves the exact inputs of each graph from a few real planning cycles, for
`rad2 eval consistency` on the target machine.

examples:
  rad2 export onnx                          # the configured planner's checkpoint, into <checkpoint>/onnx
  rad2 export onnx --checkpoint checkpoints/rad2_il --record out/trt_inputs.npz
"""

from __future__ import annotations

from pathlib import Path

from rad2_bringup.cli.common import verb_parser


def main(argv: list[str]) -> int:
    from rad2_core.cli_args import int_at_least

    ap = verb_parser("export onnx", __doc__)
    ap.add_argument("--checkpoint", default=None, help="checkpoint dir (default: planner.checkpoint_dir)")
    ap.add_argument("--out", default=None, help="ONNX dir (default: <checkpoint>/onnx)")
    ap.add_argument("--force", action="store_true", help="re-export even if the cache matches the weights")
    ap.add_argument("--record", default=None, help="save recorded graph inputs to this .npz")
    ap.add_argument("--data", default="data/eval_efficiency", help="dataset for recorded observations")
    ap.add_argument("--cycles", type=int_at_least(1, 10000), default=4, help="planning cycles to record")
    args = ap.parse_args(argv)

    from rad2_core.config import load_merged
    from rad2_planner.networks import PlannerModel
    from rad2_planner.policy import resolve_path
    from rad2_planner.runtime.consistency import ort_vs_torch, record_graph_inputs
    from rad2_planner.runtime.onnx_export import ensure_onnx, export_onnx

    params = load_merged()
    ckpt = resolve_path(args.checkpoint or params["planner"]["checkpoint_dir"])
    out = Path(args.out) if args.out else ckpt / "onnx"
    model = PlannerModel.load(ckpt)
    paths = export_onnx(model, out) if args.force else ensure_onnx(model, out)
    for g, p in paths.items():
        print(f"{g:<14} {p}  {p.stat().st_size / 1e6:.2f} MB")
    errs = ort_vs_torch(model, paths, params["runtime"])
    print("ONNX Runtime vs PyTorch, max abs error:")
    for k, v in errs.items():
        print(f"  {k:<28} {v:.2e}")
    bad = {k: v for k, v in errs.items() if v > 1e-4}
    if args.record:
        record_graph_inputs(params, ckpt, out, Path(args.record), args.data, args.cycles)
    if bad:
        print(f"FAILED: errors above 1e-4: {bad}")
        return 1
    return 0

