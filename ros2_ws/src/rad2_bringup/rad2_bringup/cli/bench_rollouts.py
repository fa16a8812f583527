"""Benchmark closed-loop rollout collection: environment steps/s and decisions/s of the rollout engine
(bev_warp_sim.rollout) with the real planner — M candidates, ONNX Runtime, the discriminator scoring
every candidate and the executed one sampled (softmax), latched for H_reuse steps — in this process and
in Ray workers, and of the simulator alone (fixed controls, no planner, no iLQR). Also prints the
pickled size of a simulator state. Prints the machine and the load before and after.

examples:
  rad2 bench rollouts                        # 8 clips x G = 4, H_reuse = 8, 1 process and 2 workers
  rad2 bench rollouts --clips 16 --workers 0 2 --h-reuse 8 --out runs/bench_rollouts.md
"""

from __future__ import annotations

from pathlib import Path

from rad2_bringup.cli.common import dataset_dirs, verb_parser


def main(argv: list[str]) -> int:
    from rad2_core.cli_args import int_at_least, schema_value, torch_device

    ap = verb_parser("bench rollouts", __doc__)
    ap.add_argument("--dataset", default="data/eval_safety", help="dataset directory of the clips")
    ap.add_argument("--clips", type=int_at_least(1, 100000), default=8, help="clips (initial states)")
    ap.add_argument("--group", type=schema_value("training", "rollout.group_size"), default=4,
                    help="rollouts per initial state (G)")
    ap.add_argument("--h-reuse", type=schema_value("training", "rl.h_reuse"), default=8,
                    help="steps each plan is executed (H_reuse)")
    ap.add_argument("--batch", type=schema_value("training", "rollout.batch_size"), default=16,
                    help="rows stepped together per chunk")
    ap.add_argument("--candidates", type=schema_value("planner", "planner.num_candidates"), default=32,
                    help="M")
    ap.add_argument("--workers", type=int_at_least(0, 4096), nargs="+", default=[0, 2],
                    help="0: this process; N: N Ray workers")
    ap.add_argument("--backend", type=schema_value("planner", "planner.backend"), default="onnxruntime",
                    help="the planner's network runtime")
    ap.add_argument("--device", type=torch_device, default="cpu",
                    help="torch device for --backend pytorch (cpu | cuda)")
    ap.add_argument("--openvino-precision", type=schema_value("planner", "runtime.openvino.precision"),
                    default=None, help="f32 | bf16: runtime.openvino.precision of --backend openvino")
    ap.add_argument("--out", default=None, help="also write the table as Markdown to this file")
    args = ap.parse_args(argv)
    if args.device not in (None, "cpu") and args.backend != "pytorch":
        ap.error(f"--device {args.device}: only with --backend pytorch (got --backend {args.backend})")
    if args.openvino_precision is not None and args.backend != "openvino":
        ap.error(f"--openvino-precision: only with --backend openvino (got --backend {args.backend})")
    dataset = str(dataset_dirs(ap, "--dataset", [args.dataset])[0])

    from rad2_core.config import load_merged
    from rad2_evaluation.benchmarks.rollouts import run_rollout_benchmark
    from rich.console import Console

    text = run_rollout_benchmark(dataset, load_merged(), clips=args.clips, group=args.group,
                                 h_reuse=args.h_reuse, batch=args.batch, candidates=args.candidates,
                                 workers=args.workers, backend=args.backend, device=args.device,
                                 runtime_overrides=(
                                     {"openvino": {"precision": args.openvino_precision}}
                                     if args.openvino_precision else None))
    Console(width=max(Console().width, 120)).print(text)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text + "\n")
    return 0

