"""Benchmark BEV rasterisation and tokenisation per frame (median / p99 in ms) over clips.

Uses a dataset directory if given (e.g. data/eval_safety), else the real fixtures of the checkout's
tests (AV2 and CommonRoad); every step (or every --stride-th) of every clip is one frame
(rad2_evaluation.benchmarks.bev).

examples:
  rad2 bench bev                         # the fixtures
  rad2 bench bev data/eval_safety --max-clips 20
"""

from __future__ import annotations

from pathlib import Path

from rad2_bringup.cli.common import find_dataset, verb_parser


def _fixture_clips(params: dict):
    """The AV2 scenario and the CommonRoad scene of the checkout's tests/fixtures (``params``: bev.yaml
    and sim.yaml as loaded, merged)."""
    from rad2_core.config import resource_path
    from rad2_datasets.adapters.av2 import load_av2_scenario
    from rad2_datasets.adapters.commonroad import load_commonroad_scenario

    fx = resource_path("tests/fixtures")
    return [
        load_av2_scenario(fx / "av2" / "0a1e6f0a-1817-4a98-b02e-db8c9327d151", params),
        load_commonroad_scenario(fx / "commonroad" / "USA_US101-5_1_T-1.xml", params=params),
    ]


def main(argv: list[str]) -> int:
    from rad2_core.cli_args import int_at_least

    parser = verb_parser("bench bev", __doc__)
    parser.add_argument("dataset", nargs="?", type=Path, help="dataset directory (default: test fixtures)")
    parser.add_argument("--max-clips", type=int_at_least(1), default=20,
                        help="clips to use from a dataset (default 20)")
    parser.add_argument("--stride", type=int_at_least(1), default=1, help="use every N-th step (default 1)")
    args = parser.parse_args(argv)
    from rad2_core.config import load_merged
    from rad2_core.storage import iter_dataset
    from rad2_evaluation.benchmarks.bev import print_bev_timings, time_bev_pipeline

    params = load_merged("bev", "sim", "vehicle")

    if args.dataset is not None:
        dataset = find_dataset(args.dataset)
        if dataset is None:
            parser.error(f"dataset: {args.dataset} is not a dataset directory (no index.json)")
        clips = []
        for c in iter_dataset(dataset):
            clips.append(c)
            if len(clips) >= args.max_clips:
                break
    else:
        clips = _fixture_clips(params)
    print_bev_timings(time_bev_pipeline(clips, params, args.stride), params)
    return 0

