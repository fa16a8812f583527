"""Convert a real-traffic corpus (NGSIM US-101 and Lankershim as CommonRoad scenarios) with every
qualifying vehicle as the ego into train / validation / test clip datasets, split by scenario file.

The splits are the committed lists ``<splits>/<corpus>_{train,val,test}.txt`` (checked: disjoint, every
scenario file of the corpus in one); --make-splits writes them first (files that log the same vehicles
kept together, the groups in a seeded shuffle per road, test 25 %, validation 10 %; refused when the
lists exist). A vehicle logged identically in an earlier file of its split (the corpus repeats
recordings) is converted once; one shared across splits stops the conversion. Qualifying egos
(params/bev.yaml adapters.corpus_ego and adapters.promoted_ego): cars of passenger-car size, logged at
least 5 s without gaps, moving, on the lanelets, whose logged box overlaps no other road user's. A
qualifying ego is refused when its clip fails the simulator's checks (route, plausibility); refusals are
counted by reason. Output: <out>/{train,val,test} datasets (index.json, clips/, maps/) and
<out>/corpus_report.json. --bundle writes a fixed subset of the test split (--bundle-clips per road) as
one more dataset (how data/eval_real is made).

examples:
  rad2 data corpus /work/shared/data/ngsim --splits data/splits --out out/ngsim
  rad2 data corpus /work/shared/data/ngsim --splits data/splits --out out/ngsim --split test \\
      --bundle data/eval_real --bundle-clips 25
  rad2 data corpus /work/shared/data/ngsim --splits data/splits --out out/try \\
      --only US101/USA_US101-22_1_T-1.xml Lankershim/USA_Lanker-2_22_T-1.xml
  rad2 eval policy --policy rad2 idm --split out/ngsim/test --out runs/ngsim_test
"""

from __future__ import annotations

import sys
from pathlib import Path

from rad2_bringup.cli.common import verb_parser


def main(argv: list[str]) -> int:
    from rad2_core.cli_args import int_at_least

    ap = verb_parser("data corpus", __doc__)
    ap.add_argument("root", type=Path, help="corpus root (holding US101/ and Lankershim/ for ngsim)")
    ap.add_argument("--corpus", default="ngsim", help="corpus name (default ngsim)")
    ap.add_argument("--splits", type=Path, required=True, help="folder of the split lists (data/splits)")
    ap.add_argument("--out", type=Path, required=True, help="output folder: one dataset per split")
    ap.add_argument("--split", nargs="+", dest="only_splits", metavar="SPLIT",
                    help="convert only these splits (train val test; default all)")
    ap.add_argument("--only", nargs="+", metavar="SCENARIO",
                    help="convert only these scenario files (paths relative to root, as in the lists)")
    ap.add_argument("--make-splits", action="store_true",
                    help="write the split lists first (refused when they exist)")
    ap.add_argument("--bundle", type=Path, help="also write a fixed subset of the test split here")
    ap.add_argument("--bundle-clips", type=int_at_least(1), default=25,
                    help="clips per road in --bundle (default 25)")
    ap.add_argument("--params", type=Path, help="a bev.yaml to use instead of params/bev.yaml")
    ap.add_argument("--no-progress", action="store_true", help="no progress bars")
    args = ap.parse_args(argv)

    from rad2_core.config import ParameterError, load_all, load_params, merged
    from rad2_datasets.corpus import (
        SPLITS,
        CorpusError,
        bundle_subset,
        convert_corpus,
        corpus_scenarios,
        make_splits,
        scenario_groups,
        split_path,
        write_splits,
    )

    splits = tuple(args.only_splits or SPLITS)
    bad = sorted(set(splits) - set(SPLITS))
    if bad:
        ap.error(f"--split: unknown {bad}; known: {list(SPLITS)}")
    if args.bundle is not None and "test" not in splits:
        ap.error("--bundle takes its clips from the test split: include test in --split")
    try:
        params = load_all(("sim", "validators"))
        params["bev"] = load_params(args.params if args.params else "bev")
        params = merged(params, "bev", "sim", "validators")
        if args.make_splits:
            existing = [p for p in (split_path(args.splits, args.corpus, s) for s in SPLITS) if p.exists()]
            if existing:
                ap.error(f"--make-splits: {existing[0]} exists; the committed lists stay fixed")
            scenarios = corpus_scenarios(args.root, args.corpus)
            groups = scenario_groups(args.root, scenarios, progress=not args.no_progress)
            for p in write_splits(make_splits(scenarios, groups), args.splits, args.corpus):
                print(f"wrote {p}")
        report = convert_corpus(args.root, args.splits, args.out, corpus=args.corpus, params=params,
                                only=args.only, splits=splits, progress=not args.no_progress)
        print("\n".join(report.lines()))
        if args.bundle is not None:
            chosen = bundle_subset(args.out / "test", args.bundle, args.bundle_clips,
                                   progress=not args.no_progress)
            print(f"{args.bundle}: {len(chosen)} clips of {args.out / 'test'} "
                  f"(list in {args.bundle / 'clips.txt'})")
    except (ParameterError, CorpusError, OSError) as exc:
        print(f"rad2 data corpus: error: {exc}", file=sys.stderr)
        return 1
    if report.converted == 0:
        print("rad2 data corpus: error: no clip converted", file=sys.stderr)
        return 1
    return 0
