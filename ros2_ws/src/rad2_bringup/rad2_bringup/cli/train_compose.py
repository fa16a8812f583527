"""Write one planner checkpoint from the generator of one checkpoint and the discriminator of another
(rad2_training/compose.py): the staged RL schedule's result, or any generator with any trained discriminator
of the same network configuration. Weights are written as float16 (the shipped form) unless --fp32, or
--lossless: each weights file in float16 where that changes no value, else float32 (the shipped RL
checkpoint: its generator stayed at a float16 checkpoint's weights, its discriminator did not).

example (the shipped RL checkpoint; both runs' training records are kept in config.json under training):
  rad2 train compose --generator runs/rl_full_plan_s0/final \\
      --discriminator runs/rl_cur_safe_prior4_s0/final --out runs/rad2_rl_v1
"""

from __future__ import annotations

import shlex
import sys

from rad2_bringup.cli.common import verb_parser


def main(argv: list[str]) -> int:
    ap = verb_parser("train compose", __doc__)
    ap.add_argument("--generator", required=True, help="checkpoint whose generator (and normaliser) is kept")
    ap.add_argument("--discriminator", required=True, help="checkpoint whose trained discriminator is kept")
    ap.add_argument("--out", required=True, help="output checkpoint directory")
    precision = ap.add_mutually_exclusive_group()
    precision.add_argument("--fp32", action="store_true", help="keep float32 weights (default float16)")
    precision.add_argument("--lossless", action="store_true",
                           help="float16 for a weights file whose values are all exact float16s, else fp32")
    args = ap.parse_args(argv)
    import torch
    from rad2_planner.networks.model import CheckpointError
    from rad2_training.compose import compose_checkpoint

    dtype = "lossless" if args.lossless else (torch.float32 if args.fp32 else torch.float16)
    command = shlex.join(["rad2", "train", "compose", *argv])
    try:
        out = compose_checkpoint(args.generator, args.discriminator, args.out,
                                 dtype=dtype, command=command)
    except (CheckpointError, ValueError, FileNotFoundError) as exc:
        print(f"rad2 train compose: error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {out} (generator of {args.generator}, discriminator of {args.discriminator})")
    return 0

