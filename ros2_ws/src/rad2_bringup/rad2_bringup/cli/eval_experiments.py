"""RAD-2 experiments: closed-loop metrics of several planner configurations ("arms") on the held-out
sets, each cell the mean over evaluation seeds with its spread, as one Markdown table and a plot.

An arm is written ``KIND[:ARG][@M=..][@H=..]``:
- ``il:uniform`` | ``il:medoid`` | ``il:safe_medoid``: the IL generator (``--il-checkpoint``) with a
  uniformly random candidate, or the named selection rule (the discriminator is not used);
- ``ckpt:PATH``: a planner checkpoint (e.g. ``runs/rl_seed0/final``), executed candidate = argmax of its
  discriminator when it is trained, else the ``planner.fallback_selection`` rule;
- ``ref:pdm_closed`` | ``ref:idm`` | ``ref:constant_velocity`` | ``ref:expert``: a reference policy
  (``expert`` replays the log); deterministic, so it is driven under the first seed and that result
  stands for every seed (its spread is 0 by construction); takes only ``@H=``;
- ``@D=safe`` | ``@D=all``: ``planner.discriminator_candidates`` (a trained discriminator ranks the safe set
  of ``safe_medoid`` only, or every candidate; default: params/planner.yaml);
- ``@P=4``: ``planner.discriminator_prior_weight`` κ (the consensus prior added to a trained
  discriminator's logits; evaluate an RL discriminator with the κ it was trained with);
- ``@N=per_episode`` | ``@N=per_cycle``: ``planner.initial_noise`` (one noise draw for the whole episode, so
  consecutive plans change only as the scene does, or a new draw every cycle);
- ``@R=off``: learned only, every rule stage after the selection off (stall recovery, plan braking,
  traffic rules, safety envelope, comfort limits, drivable area): what the networks do, beside the
  shipped planner's row, which shows what the rules add;
- ``@M=64``: candidates per cycle (inference-time scaling, RAD-2 Table 10); ``@H=4``: replanning period
  in steps (latched execution, RAD-2 Table 5; evaluation default ``evaluation.h_reuse``).

``--sim-set KEY=VALUE`` runs every arm in a simulator with a setting of params/sim.yaml changed, e.g.
``sim.reactive_agents=true`` (agents keep their logged paths but adapt their speed by IDM, so a follower
brakes for a slower ego instead of driving into it).

Metrics (bev_warp_sim.metrics.aggregate): CR, AF-CR and Safety@1 on the safety split, EP-Mean and EP@1.0
on the efficiency split, both kinds and off-road on any other split (e.g. data/eval_real); on all of them
comfort-violating steps, plan-to-plan change (plan_speed_change_m_s), the nuPlan-style score, the cycle
p99 (cycle_p99_ms: after its rollouts each arm's decisions are timed alone, one clip at a time and one call
per cycle, over evaluation.latency_cycles cycles of params/sim.yaml; a resumed run times them again) and
the wall time per clip; summary_<split>.png draws every arm's metrics with the spread over the seeds.

Every clip is checked before the first rollout, as the simulator would check it: refused clips are
listed with their reasons and the run stops (exit 2), or with --skip-bad runs without them and
experiments.md names them. Finished chunks go to <out>/episodes.jsonl as they come; --resume
continues an interrupted run in --out (the arms' settings must be the same).

examples:
  rad2 eval experiments --arms il:uniform il:medoid il:safe_medoid \\
      ckpt:runs/rl_seed0/final --seeds 0 1 2 --workers 2 --out out/rl_experiments
  rad2 eval experiments --arms il:safe_medoid@M=8 il:safe_medoid@M=128 --seeds 0 1 2
  rad2 eval experiments --arms ckpt:checkpoints/rad2_rl ref:pdm_closed ref:idm ref:expert \
      --splits data/eval_real --seeds 0 1 2 --workers 2 --sim-set sim.reactive_agents=true --out out/real
  rad2 eval experiments --merge out/e_s0/results.json out/e_s1/results.json --out out/experiments
  rad2 eval experiments --arms il:medoid il:safe_medoid --seeds 0 1 2 --out out/e --resume --skip-bad
"""

from __future__ import annotations

import json
from pathlib import Path

from rad2_bringup.cli.common import simulation_params, verb_parser


def main(argv: list[str]) -> int:
    from rad2_core.cli_args import int_at_least, schema_value, torch_device

    ap = verb_parser("eval experiments", __doc__)
    ap.add_argument("--arms", nargs="+", default=["il:uniform", "il:medoid", "il:safe_medoid"],
                    help="arms to evaluate (see above)")
    ap.add_argument("--il-checkpoint", default=None,
                    help="generator of the il: arms (default: planner.checkpoint_dir of params/planner.yaml, "
                         "the shipped generator; e.g. checkpoints/rad2_il_rich for the imitation baselines)")
    ap.add_argument("--splits", nargs="+", default=["data/eval_safety", "data/eval_efficiency"])
    ap.add_argument("--seeds", nargs="+", type=int_at_least(0, 2**32 - 1), default=[0, 1, 2],
                    help="evaluation seeds (>= 3 for a spread)")
    ap.add_argument("--workers", type=int_at_least(0, 256), default=0,
                    help="Ray workers per arm (0: this process)")
    ap.add_argument("--max-clips", type=int_at_least(1), default=None,
                    help="first N clips of each split (quick looks)")
    ap.add_argument("--out", type=Path, default=Path("out/rl_experiments"))
    ap.add_argument("--backend", type=schema_value("planner", "planner.backend"), default=None,
                    help="the planner's network runtime (default: planner.backend)")
    ap.add_argument("--device", type=torch_device, default=None,
                    help="torch device of --backend pytorch (cpu | cuda)")
    ap.add_argument("--threads", type=int_at_least(1, 256), default=None,
                    help="CPU threads of this process's planner (--workers 0; e.g. 1 per process when "
                         "several run side by side)")
    ap.add_argument("--merge", type=Path, nargs="+", default=None, metavar="RESULTS_JSON",
                    help="evaluate nothing: one table from the results.json of earlier runs (e.g. one "
                         "run per seed, side by side), written to --out")
    ap.add_argument("--sim-set", action="append", default=[], metavar="KEY=VALUE",
                    help="run the simulator with a setting of params/sim.yaml changed (repeatable; e.g. "
                         "sim.reactive_agents=true: agents follow their logged paths with IDM speeds)")
    ap.add_argument("--rename", nargs="+", default=[], metavar="OLD->NEW",
                    help="with --merge: show arm OLD as NEW (e.g. a checkpoint evaluated under another path)")
    ap.add_argument("--skip-bad", action="store_true",
                    help="run without the clips the simulator refuses, naming them in the report (default: "
                         "list them and stop before any rollout)")
    ap.add_argument("--resume", action="store_true",
                    help="continue the run in --out from its episodes.jsonl (same arm settings; finished "
                         "clips are not driven again)")
    args = ap.parse_args(argv)
    if args.device not in (None, "cpu") and args.backend != "pytorch":
        ap.error(f"--device {args.device}: only with --backend pytorch (got --backend {args.backend})")
    if args.sim_set and args.merge:
        ap.error("--sim-set: not with --merge (it merges runs that have already been simulated)")
    if args.rename and not args.merge:
        ap.error("--rename: only with --merge")
    if args.merge and (args.resume or args.skip_bad):
        ap.error("--resume / --skip-bad: not with --merge (it drives nothing)")
    from rad2_evaluation.episode_log import EPISODES_FILE

    if args.resume and not (args.out / EPISODES_FILE).is_file():
        ap.error(f"--resume: {args.out} holds no {EPISODES_FILE} (nothing to resume)")
    if args.merge:
        from rad2_evaluation.experiments import merge_results, write_report

        missing = [str(p) for p in args.merge if not p.is_file()]
        if missing:
            ap.error(f"--merge: no such file {missing}")
        renames = {}
        for item in args.rename:
            old, sep, new = item.partition("->")  # arm labels hold "=" (@D=safe)
            if not (sep and old and new):
                ap.error(f"--rename {item!r}: expected OLD->NEW")
            renames[old] = new
        try:
            results, splits, runs = merge_results(args.merge, renames)
        except ValueError as exc:
            ap.error(str(exc))
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.json").write_text(json.dumps(results, indent=1))
        write_report(results, splits, f"{runs} per cell, merged from {len(args.merge)} results files",
                     args.out, args.max_clips, 0.0)
        print(f"merged {len(args.merge)} runs into {args.out / 'experiments.md'}")
        return 0

    from rad2_core.cli_args import schema_choices
    from rad2_core.config import ParameterError
    from rad2_evaluation.experiments import parse_arm, run_experiments
    from rad2_planner.policy import resolve_path

    try:
        files, sim_overrides = simulation_params(args.sim_set)  # refuse a bad setting before any work
    except ParameterError as exc:
        ap.error(str(exc))

    il_checkpoint = args.il_checkpoint or files["planner"]["planner"]["checkpoint_dir"]
    candidates = schema_choices("planner", "planner.discriminator_candidates")
    noise_modes = schema_choices("planner", "planner.initial_noise")
    try:
        arms = [parse_arm(a, str(resolve_path(il_checkpoint)), candidates, noise_modes) for a in args.arms]
    except ValueError as exc:
        ap.error(f"--arms: {exc}")
    for split in args.splits:
        if not (resolve_path(split) / "index.json").is_file():
            ap.error(f"--splits: {split} is not a dataset directory (no index.json)")
    from bev_warp_sim.preflight import RefusedClipsError
    from rad2_evaluation.episode_log import SettingsMismatch

    try:
        run_experiments(arms, args.splits, args.seeds, args.out, files, sim_overrides=sim_overrides,
                        workers=args.workers, max_clips=args.max_clips, threads=args.threads,
                        backend=args.backend, device=args.device, resume=args.resume,
                        skip_bad=args.skip_bad)
    except (RefusedClipsError, SettingsMismatch) as exc:
        ap.error(str(exc))
    print(f"wrote {args.out / 'experiments.md'}, experiments.png and results.json")
    return 0

