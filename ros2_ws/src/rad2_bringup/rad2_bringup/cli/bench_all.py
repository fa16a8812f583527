"""Run every benchmark of the project and write one Markdown table (the README's figures come from it).

Each benchmark runs as its own process (the `rad2 bench` command a user would type), with its JSON
output read back:
- planning cycle (rad2 bench planner): M = 32 and 128, ONNX Runtime on
  ``runtime.ort_intra_op_threads`` threads, encode + K denoising steps + discriminator + selection, and
  the cycle's efficiency against the FLOP floor of a matrix-product probe taken in the same run;
  selection alone (safe_medoid) with 50 agents;
- operator profile (rad2 bench planner --op-profile): at M = 32, ONNX Runtime's kernel time
  split into matrix products (with their GFLOP/s against the probe) and every other operator;
- iLQR tracker (rad2 bench ilqr --no-ipopt): single cold / warm solve and a batch of 64;
- BEV warp (rad2 bench sim --warp-only): OpenCV vs torch per frame;
- ROS graph (rad2 bench graph): the planner node as its own process, real inputs played into it
  over DDS at 10 Hz, input stamp -> trajectory arrival (the in-graph figure);
- with --rollouts: closed-loop rollout throughput (rad2 bench rollouts);
- with --openvino: the planning cycle again on the openvino backend, at f32 and at bf16
  (``runtime.openvino.precision``; bf16 is plain f32 on a CPU without native bfloat16).

The table gives the machine, the threads and the 1-minute load before and after each benchmark, and
the target figure where one exists. Figures taken at a load above 1.2 on this 2-core machine are flagged:
compare only figures taken at similar loads.

examples:
  rad2 bench all                  # ~4 min; writes out/bench_all/bench_all.md
  rad2 bench all --cycles 500 --rollouts --out out/bench_all
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from rad2_bringup.cli.common import verb_parser


def _run(args: list[str], log) -> None:
    """``rad2 bench <args>`` as a process of its own (this interpreter), its output into ``log``."""
    cmd = [sys.executable, "-m", "rad2_bringup.cli", "bench", *args]
    log.write(f"$ {' '.join(cmd)}\n")
    log.flush()
    res = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT)
    if res.returncode != 0:
        raise SystemExit(f"benchmark failed ({res.returncode}): rad2 bench {' '.join(args)} (see {log.name})")


def main(argv: list[str]) -> int:
    from rad2_core.cli_args import int_at_least

    ap = verb_parser("bench all", __doc__)
    ap.add_argument("--out", type=Path, default=Path("out") / "bench_all", help="output directory")
    ap.add_argument("--cycles", type=int_at_least(1, 100000), default=200, help="planning cycles per M")
    ap.add_argument("--rollouts", action="store_true",
                    help="also run the rollout-throughput benchmark (~5 min)")
    ap.add_argument("--openvino", action="store_true",
                    help="also time the planning cycle on the openvino backend, f32 and bf16 (~1 min)")
    args = ap.parse_args(argv)

    from rad2_evaluation.benchmarking import bench_summary
    from tqdm import tqdm

    out = args.out.absolute()
    out.mkdir(parents=True, exist_ok=True)
    steps = (["planner", "ops", "ilqr", "warp", "graph"] + (["rollouts"] if args.rollouts else [])
             + (["openvino_f32", "openvino_bf16"] if args.openvino else []))
    t0 = time.time()
    with open(out / "bench_all.log", "w") as log:
        for step in tqdm(steps, desc="benchmarks"):
            if step == "planner":
                _run(["planner", "--backend", "onnxruntime", "--m", "32", "128",
                      "--cycles", str(args.cycles), "--out", str(out / "planner")], log)
            elif step == "ops":
                _run(["planner", "--op-profile", "--m", "32", "--cycles", "100",
                      "--out", str(out / "planner")], log)
            elif step == "ilqr":
                _run(["ilqr", "--no-ipopt", "--batch", "64", "--json", str(out / "ilqr.json"),
                      "--png", str(out / "ilqr.png")], log)
            elif step == "warp":
                _run(["sim", "--warp-only", "--batch", "1", "16", "64", "--json",
                      str(out / "warp.json")], log)
            elif step == "graph":
                _run(["graph", "--cycles", str(max(args.cycles, 100)), "--out",
                      str(out / "graph")], log)
            elif step.startswith("openvino_"):
                _run(["planner", "--backend", "openvino", "--openvino-precision",
                      step.split("_")[1], "--m", "32", "128", "--cycles", str(args.cycles), "--out",
                      str(out / f"planner_{step}")], log)
            else:
                _run(["rollouts", "--clips", "16", "--workers", "0", "2", "--out",
                      str(out / "rollouts.md")], log)

    text = bench_summary(out, include_rollouts=args.rollouts, elapsed_s=time.time() - t0)
    (out / "bench_all.md").write_text(text)
    print(text)
    print(f"wrote {out / 'bench_all.md'} (raw: planner.json, planner_ops.json, ilqr.json, warp.json, "
          "graph.json; log: bench_all.log)")
    return 0

