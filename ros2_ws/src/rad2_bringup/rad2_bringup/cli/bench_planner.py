"""Latency of one RAD-2 planning cycle per stage: encode, K denoising steps for M candidates, score, select.

For each M it runs --warmup + --cycles full cycles (``Rad2Policy.plan``, discriminator always run) and
prints median / p90 / p99 / max per stage, writes a JSON with the raw figures and a PNG plot.
Observations: real ones built from a dataset (--data, default the efficiency evaluation set) so the
masks are realistic; ``--random-inputs`` uses random tensors instead.

Reproducibility: it prints the machine, the threads, the load before and after, and the efficiency
of the cycle: the median (and p99) cycle time divided by the FLOP floor, the time the cycle's network
FLOPs take at the throughput of a matrix-product probe run in the same process (the fastest of
PyTorch's MKL, its oneDNN and ONNX Runtime's MLAS; rad2_evaluation.benchmarking). It also times the
selection rule alone (``safe_medoid``: every candidate against every agent over the plan) on synthetic
scenes with --agents agents.

The benchmark itself is rad2_evaluation.benchmarks.planner.

examples:
  rad2 bench planner --backend onnxruntime --out out/bench_latency
  rad2 bench planner --compare-fixed-shapes --m 32 64 128 --cycles 400
  rad2 bench planner --op-profile --m 32 --cycles 100   # time per operator
"""

from __future__ import annotations

from rad2_bringup.cli.common import verb_parser


def main(argv: list[str]) -> int:
    from rad2_core.cli_args import int_at_least, schema_value, torch_device

    ap = verb_parser("bench planner", __doc__)
    ap.add_argument("--backend", type=schema_value("planner", "planner.backend"), default=None,
                    help="pytorch | onnxruntime | openvino | tensorrt (default: planner.backend)")
    ap.add_argument("--device", type=torch_device, default=None,
                    help="torch device for --backend pytorch (cpu | cuda)")
    ap.add_argument("--checkpoint", default=None, help="checkpoint dir (default: planner.checkpoint_dir)")
    ap.add_argument(
        "--random-init", action="store_true", help="random weights (latency does not depend on them)"
    )
    ap.add_argument("--m", type=schema_value("planner", "planner.num_candidates"), nargs="+",
                    default=[8, 16, 32, 64, 128], help="candidate counts M")
    ap.add_argument("--k", type=schema_value("planner", "planner.num_denoise_steps"), default=None,
                    help="denoising steps K (default: planner.num_denoise_steps)")
    ap.add_argument("--sampler", type=schema_value("planner", "planner.sampler"), default=None,
                    help="ddim | dpmpp_2m (default: planner.sampler)")
    ap.add_argument("--cycles", type=int_at_least(1), default=200)
    ap.add_argument("--warmup", type=int_at_least(0), default=20)
    ap.add_argument("--data", default="data/eval_efficiency", help="dataset for realistic observations")
    ap.add_argument("--random-inputs", action="store_true")
    ap.add_argument("--agents", type=int_at_least(0, 10000), default=50,
                    help="agents in the selection-only timing")
    ap.add_argument("--out", default="out/bench_latency", help="output prefix (.json, .png)")
    ap.add_argument("--ort-providers", nargs="+", default=None, metavar="PROVIDER",
                    help="overrides runtime.ort_providers, e.g. CUDAExecutionProvider CPUExecutionProvider")
    ap.add_argument("--cuda-graphs", choices=("on", "off"), default=None,
                    help="overrides runtime.torch_cuda_graphs (pytorch backend on cuda)")
    ap.add_argument("--fixed-shapes", choices=("on", "off"), default=None,
                    help="overrides runtime.ort_fixed_shapes (onnxruntime: sessions with the cycle's "
                         "dimensions pinned)")
    ap.add_argument("--openvino-precision", type=schema_value("planner", "runtime.openvino.precision"),
                    default=None, help="overrides runtime.openvino.precision (openvino backend): f32 | bf16")
    ap.add_argument("--compare-fixed-shapes", action="store_true",
                    help="instead: runtime.ort_fixed_shapes off vs on, cycles alternated in one process "
                         "(onnxruntime), written to <out>_fixed_shapes.json")
    ap.add_argument("--op-profile", action="store_true",
                    help="instead: ONNX Runtime's operator profiler over --cycles cycles at one --m, "
                         "time per graph and operator type against the matrix-product probe, written to "
                         "<out>_ops.json / <out>_ops.png")
    args = ap.parse_args(argv)
    from rad2_core.config import load_merged

    params = load_merged()
    runtime_overrides = {}
    if args.ort_providers is not None:
        runtime_overrides["ort_providers"] = args.ort_providers
    if args.cuda_graphs is not None:
        runtime_overrides["torch_cuda_graphs"] = args.cuda_graphs == "on"
    if args.fixed_shapes is not None:
        runtime_overrides["ort_fixed_shapes"] = args.fixed_shapes == "on"
    if args.openvino_precision is not None:
        backend = args.backend or params["planner"]["backend"]
        if backend != "openvino":
            ap.error(f"--openvino-precision: only with the openvino backend (--backend or planner.backend; "
                     f"got {backend})")
        runtime_overrides["openvino"] = {"precision": args.openvino_precision}

    if args.op_profile:
        from rad2_evaluation.benchmarks.planner import run_operator_profile

        if len(args.m) != 1:
            ap.error(f"--op-profile: profiles one candidate count, got --m {' '.join(map(str, args.m))}")
        if args.backend not in (None, "onnxruntime"):
            ap.error(f"--op-profile: ONNX Runtime's profiler, so --backend onnxruntime, got {args.backend!r}")

        run_operator_profile(params, args.m[0], cycles=args.cycles,
                             data=None if args.random_inputs else args.data,
                             checkpoint=args.checkpoint, out=args.out)
        return 0
    if args.compare_fixed_shapes:
        from rad2_evaluation.benchmarks.planner import compare_runtime_setting

        compare_runtime_setting(params, "ort_fixed_shapes", (False, True), args.m, cycles=args.cycles,
                                warmup=args.warmup, data=None if args.random_inputs else args.data,
                                checkpoint=args.checkpoint, out=f"{args.out}_fixed_shapes")
        return 0
    from rad2_evaluation.benchmarks.planner import run_latency_benchmark

    run_latency_benchmark(params, args.m, backend=args.backend, device=args.device,
                          checkpoint=args.checkpoint,
                          random_init=args.random_init, k=args.k, sampler=args.sampler, cycles=args.cycles,
                          warmup=args.warmup, data=None if args.random_inputs else args.data,
                          agents=args.agents, out=args.out, runtime_overrides=runtime_overrides)
    return 0

