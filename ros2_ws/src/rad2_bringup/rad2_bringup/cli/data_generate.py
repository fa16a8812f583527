"""Generate SUMO driving clips (rad2 Clip datasets) with injected safety events or efficiency cases.

All tunables live in params/scenarios.yaml; the same seed always gives the same clips.

examples:
  rad2 data generate --out out/my_set --kinds hard_brake cut_in --count 20 --seed 1
  rad2 data generate --bundled                 # regenerate data/eval_safety, eval_efficiency, train
  rad2 data generate --preset train_large --out out/train_large --workers 2 [--count 5000]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rad2_bringup.cli.common import verb_parser


def _parser() -> argparse.ArgumentParser:
    from rad2_core.cli_args import int_at_least, schema_choices
    from rad2_datasets.scenarios import events

    ap = verb_parser("data generate", __doc__)
    ap.add_argument("--out", type=Path, help="output dataset directory")
    ap.add_argument("--kinds", nargs="+", choices=list(events.ALL_KINDS), help="scenario kinds (round-robin)")
    ap.add_argument("--count", type=int_at_least(1, 1000000), help="number of clips")
    ap.add_argument("--seed", type=int_at_least(0, 2**31 - 1), help="base seed (clip i uses seed + i)")
    ap.add_argument("--workers", type=int_at_least(1, 256), default=1, help="worker processes (default 1)")
    ap.add_argument(
        "--bundled",
        action="store_true",
        help="regenerate the committed sets under data/ from presets.bundled in params/scenarios.yaml",
    )
    ap.add_argument(
        "--preset", help="a preset of params/scenarios.yaml (e.g. train_large); flags override it"
    )
    ap.add_argument("--data-dir", type=Path, default=None,
                    help="where --bundled writes (default: data/ of the checkout)")
    ap.add_argument("--cache-dir", type=Path, help="network cache (default scenarios.network_cache_dir)")
    ap.add_argument(
        "--append", action="store_true", help="add to an existing dataset instead of replacing it"
    )
    ap.add_argument("--network",
                    choices=schema_choices("scenarios", "scenarios.presets.eval_signals.network"),
                    help="use only this network kind (default: each kind's networks in "
                    "params/scenarios.yaml)")
    ap.add_argument("--signals", action="store_true",
                    help="export traffic-light states (map signals + per-step states; off for the "
                    "bundled sets)")
    ap.add_argument("--rich", action="store_true",
                    help="richer scenes: pedestrians, cyclists, parked cars, varied lane widths, ego sizes "
                    "and densities (scenarios.rich in params/scenarios.yaml; off for the bundled sets)")
    return ap


def _settings(args: argparse.Namespace, ap: argparse.ArgumentParser, presets: dict) -> tuple:
    """(kinds, network, signals, rich, count, seed) from the flags over the --preset (flags win)."""
    from rad2_datasets.scenarios import events

    spec = {}
    if args.preset:
        args.preset = args.preset.replace("-", "_")
        if args.preset not in presets or args.preset == "bundled":
            ap.error(f"--preset {args.preset!r}: choose one of {[p for p in presets if p != 'bundled']}")
        spec = presets[args.preset]
    kinds = args.kinds or spec.get("kinds") or list(events.ALL_KINDS)
    network = args.network or spec.get("network")
    signals = bool(args.signals or spec.get("signals", False))
    rich = bool(args.rich or spec.get("rich", False))
    count = args.count if args.count is not None else spec.get("count")
    seed = args.seed if args.seed is not None else spec.get("seed", 0)
    if args.out is None:
        ap.error("--out is required (unless --bundled)")
    if count is None:
        ap.error("--count is required (or a --preset that sets it)")
    if count < 1:
        ap.error(f"--count must be >= 1, got {count}")
    return kinds, network, signals, rich, count, seed


def main(argv: list[str]) -> int:
    ap = _parser()
    args = ap.parse_args(argv)
    from bev_warp_sim.safety import min_ttc_of_log
    from rad2_core.config import load_all, resource_path
    from rad2_datasets.scenarios.generate import (
        clean_dataset_dir,
        generate_bundled,
        generate_dataset,
        print_report,
    )

    params = load_all(("scenarios", "vehicle", "sim"))
    presets = params["scenarios"]["scenarios"]["presets"]
    if args.bundled:
        data_dir = args.data_dir if args.data_dir is not None else resource_path("data", required=False)
        generate_bundled(data_dir, min_ttc_of_log, params=params, seed=args.seed, workers=args.workers,
                         cache_dir=args.cache_dir)
        return 0

    kinds, network, signals, rich, count, seed = _settings(args, ap, presets)
    if not args.append:
        clean_dataset_dir(args.out)
    rep = generate_dataset(
        args.out,
        list(kinds),
        int(count),
        int(seed),
        log_safety=min_ttc_of_log,
        params=params,
        workers=args.workers,
        cache_dir=args.cache_dir,
        append=args.append,
        description=f"SUMO clips: kinds {list(kinds)}, count {count}, seed {seed}"
        + (f", network {network}" if network else "") + (", with signals" if signals else "")
        + (", rich scenes" if rich else ""),
        network_kind=network,
        signals=signals,
        rich=rich,
    )
    print_report(args.out.name, rep)
    print(json.dumps({"out": str(args.out), "clips": rep["clips"]}))
    return 0
