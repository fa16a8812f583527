"""Closed-loop RL of RAD-2 (TC-GRPO for the discriminator, On-policy Generator Optimization for the
generator) on the BEV-Warp simulator: rad2_training/train.py, driven from the command line.

Settings come from ``rl:`` in params/training.yaml (``--set rl.KEY=VALUE`` overrides one, checked against
params/training.schema.yaml). The run directory gets TensorBoard curves (``tb/``: rewards, advantages,
entropy, β, clip-filter rate, collision rate and progress of the validation clips), a resumable
checkpoint ``last/`` every ``rl.checkpoint_every`` rounds, ``history.json`` and ``curves.png``; the trained
planner checkpoint (generator + discriminator, safetensors, fp16 with --export-fp16) is ``final/``, and
``best/`` is the planner of the round kept on validation (``rl.keep_round_by``: by default the fewest
at-fault collisions, then the highest nuPlan-style score, then the lowest collision rate; the round is
recorded in its config.json under ``training.rl_best``). The validation clips are held out of the
training sets, or with ``rl.validation_data`` drawn from other dataset directories (clips of locations
the training sets do not cover). A run started from an RL checkpoint keeps that run's record under
``training.previous_rl``.
Every clip is checked before the first rollout as the simulator will check it; refused clips are
listed with their reasons and the run stops, unless ``--skip-bad`` trains without them.
Kill it at any time and rerun with ``--resume``: it continues from the last checkpoint with the same
weights, optimisers, buffer, entropy temperature and random generators.

examples:
  rad2 train rl --train-data out/rl_train/rl_safety out/rl_train/rl_efficiency \\
      --out runs/rl_seed0 --seed 0 --budget-min 120
  rad2 train rl --out runs/rl_seed0 --resume
  rad2 train rl --train-data data/train --set rl.tc_grpo.advantage=vd_grpo
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from rad2_bringup.cli.common import simulation_params, verb_parser


def _parser() -> argparse.ArgumentParser:
    from rad2_core.cli_args import float_in, int_at_least, schema_value

    ap = verb_parser("train rl", __doc__)
    ap.add_argument("--train-data", nargs="+", default=["data/train"],
                    help="dataset directories to train on (default data/train; the curated sets of "
                         "rad2 data curate are the intended input); the validation clips are "
                         "held out of every set in proportion to its size")
    ap.add_argument("--checkpoint", default=None,
                    help="starting planner checkpoint (default: planner.checkpoint_dir)")
    ap.add_argument("--out", default="runs/rl", help="run directory")
    ap.add_argument("--resume", action="store_true", help="continue from <out>/last")
    ap.add_argument("--seed", type=schema_value("training", "rl.seed"), default=None,
                    help="overrides rl.seed")
    ap.add_argument("--iterations", type=schema_value("training", "rl.iterations"), default=None,
                    help="overrides rl.iterations")
    ap.add_argument("--budget-min", type=float_in(0.0, exclusive_min=True), default=math.inf,
                    help="wall-clock budget (minutes; default: none)")
    ap.add_argument("--workers", type=int_at_least(0, 4096), default=0,
                    help="Ray rollout workers (0: collect in this process; "
                         "cluster address: rollout.ray_address)")
    ap.add_argument("--threads", type=int_at_least(1, 256), default=None,
                    help="torch threads of this process")
    ap.add_argument("--set", action="append", default=[], metavar="rl.KEY=VALUE",
                    help="override an rl: setting")
    ap.add_argument("--sim-set", action="append", default=[], metavar="KEY=VALUE",
                    help="train in a simulator with a setting of params/sim.yaml changed (repeatable; e.g. "
                         "sim.reactive_agents=true); kept in <out>/sim_overrides.json, which --resume reuses")
    ap.add_argument("--export-fp16", action="store_true", help="write final/ with float16 weights")
    ap.add_argument("--skip-bad", action="store_true",
                    help="train without the clips the simulator refuses (listed, and kept in "
                         "<out>/skipped_clips.json; default: list them and stop before any rollout)")
    ap.add_argument("--no-progress", action="store_true")
    return ap


def main(argv: list[str]) -> int:
    ap = _parser()
    args = ap.parse_args(argv)

    from bev_warp_sim.preflight import RefusedClipsError, check_splits
    from bev_warp_sim.simulator import Simulator
    from rad2_core.config import ParameterError, merged
    from rad2_planner.networks.model import CheckpointError, PlannerModel
    from rad2_planner.policy import resolve_path
    from rad2_training.session import rl_config, run_session, split_clips, validation_from
    from rad2_training.train import check_simulator

    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    out = Path(args.out)
    saved = out / "sim_overrides.json"  # the simulator settings of this run, which a resume keeps
    try:
        files, sim_overrides = simulation_params(args.sim_set)
        if args.resume and saved.is_file():
            try:
                recorded = json.loads(saved.read_text())
            except ValueError as exc:
                ap.error(f"--resume: {saved} is not JSON ({exc}); it records the run's --sim-set settings")
            if not isinstance(recorded, dict):
                ap.error(f"--resume: {saved} holds {type(recorded).__name__}, expected {{KEY: value}}")
            if args.sim_set and sim_overrides != recorded:
                ap.error(f"--sim-set: the run was started with {recorded} ({saved}); resume it with those")
            files, sim_overrides = simulation_params(
                [f"{k}={json.dumps(v)}" for k, v in recorded.items()], str(saved))
    except ParameterError as exc:
        ap.error(str(exc))
    try:
        params, cfg, tc_cfg, ogo_cfg = rl_config(merged(files, *files), args.set, args.seed, args.iterations)
    except (ParameterError, ValueError, TypeError) as exc:
        ap.error(str(exc))
    try:
        check_simulator(cfg, bool(params["sim"]["reactive_agents"]))
    except ValueError as exc:
        ap.error(str(exc))
    if len({resolve_path(d).resolve() for d in args.train_data}) != len(args.train_data):
        ap.error(f"--train-data: a directory is given twice ({' '.join(args.train_data)}): its clips would "
                 "be both trained on and held out for validation")
    for d in args.train_data:
        if not (resolve_path(d) / "index.json").is_file():
            ap.error(f"--train-data: {d} is not a dataset directory (no index.json)")
    # every clip checked as the simulator will check it, before the first rollout of the first round
    try:
        checked = check_splits([resolve_path(d) for d in args.train_data], Simulator(params),
                               skip_bad=args.skip_bad, progress=not args.no_progress)
    except RefusedClipsError as exc:
        ap.error(f"--train-data: {exc}")
    skipped = [r for c in checked for r in c.refused]
    for r in skipped:
        print(f"skipping refused clip {r}")
    clips, groups = [], []
    for n, c in enumerate(checked):
        clips += c.clips
        groups += [n] * len(c.clips)
    if cfg.validation_data:  # validation on clips of their own (another location): train on all of these
        val_dirs = list(cfg.validation_data)
        trained = {resolve_path(d).resolve() for d in args.train_data}
        for d in val_dirs:
            if not (resolve_path(d) / "index.json").is_file():
                ap.error(f"rl.validation_data: {d} is not a dataset directory (no index.json)")
            if resolve_path(d).resolve() in trained:
                ap.error(f"rl.validation_data: {d} is also a --train-data set")
        try:
            checked_val = check_splits([resolve_path(d) for d in val_dirs], Simulator(params),
                                       skip_bad=args.skip_bad, progress=not args.no_progress)
        except RefusedClipsError as exc:
            ap.error(f"rl.validation_data: {exc}")
        for r in (r for c in checked_val for r in c.refused):
            print(f"skipping refused validation clip {r}")
            skipped.append(r)
        pool = [clip for c in checked_val for clip in c.clips]
        pool_groups = [n for n, c in enumerate(checked_val) for _ in c.clips]
        train_clips = clips
        try:
            val_clips = validation_from(pool, cfg, pool_groups, train_clips)
        except ValueError as exc:
            ap.error(str(exc))
    else:
        # validation clips are drawn from every --train-data set in proportion to its size
        train_clips, val_clips = split_clips(clips, cfg, groups)
    ckpt = resolve_path(args.checkpoint or params["planner"]["checkpoint_dir"])
    try:
        model = PlannerModel.load(ckpt)
    except CheckpointError as exc:
        ap.error(f"--checkpoint: {exc}")
    if args.resume and not (out / "last" / "run.json").is_file():
        ap.error(f"--resume: no checkpoint in {out / 'last'}")
    out.mkdir(parents=True, exist_ok=True)
    saved.write_text(json.dumps(sim_overrides, indent=1))
    (out / "skipped_clips.json").write_text(json.dumps([r.as_dict() for r in skipped], indent=1))
    run_session(model, ckpt, params, cfg, tc_cfg, ogo_cfg, train_clips, val_clips, out,
                workers=args.workers, resume=args.resume, budget_s=args.budget_min * 60.0,
                export_fp16=args.export_fp16, progress=not args.no_progress)
    return 0

