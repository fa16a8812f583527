"""The NGSIM real-traffic corpus as datasets (rad2_datasets.corpus): the committed split lists, the
conversion of real scenarios into clips the simulator accepts, and the bundled data/eval_real.

The corpus lives at /work/shared/data/ngsim (override with RAD2_NGSIM); the tests that read it skip,
saying so, where it is absent. The split lists and data/eval_real are committed and always checked.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from rad2_core.config import load_merged
from rad2_core.storage import iter_dataset, read_index
from rad2_datasets.corpus import (
    CORPORA,
    SPLITS,
    CorpusError,
    bundle_subset,
    convert_corpus,
    corpus_scenarios,
    make_splits,
    read_splits,
    road_of,
    scenario_groups,
)

PARAMS = load_merged()

LOG_PARAMS = load_merged("bev", "sim", "validators")

ROOT = Path(__file__).resolve().parents[2]
SPLITS_DIR = ROOT / "data" / "splits"
EVAL_REAL = ROOT / "data" / "eval_real"
NGSIM = Path(os.environ.get("RAD2_NGSIM", "/work/shared/data/ngsim"))
needs_corpus = pytest.mark.skipif(not (NGSIM / "US101").is_dir() or not (NGSIM / "Lankershim").is_dir(),
                                  reason=f"the NGSIM corpus is not at {NGSIM} (set RAD2_NGSIM to its folder)")
# one freeway scene with lane changes and an on-ramp (and the same recording under a second name), one
# arterial scene with turns at junctions
SAMPLE = ["US101/USA_US101-10_1_T-1.xml", "US101/USA_US101-10_3_T-1.xml",
          "Lankershim/USA_Lanker-2_22_T-1.xml"]


def _simulator():
    from bev_warp_sim.simulator import Simulator

    return Simulator(PARAMS)


def test_split_lists_are_disjoint_test_is_a_fifth_and_every_split_has_both_roads():
    lists = read_splits(SPLITS_DIR, "ngsim")  # refuses repeats within and across the lists
    every = [s for split in SPLITS for s in lists[split]]
    assert len(every) == len(set(every))
    assert len(lists["test"]) >= 0.2 * len(every)
    for split in SPLITS:
        assert {road_of(s) for s in lists[split]} == set(CORPORA["ngsim"]), split
        assert lists[split] == sorted(lists[split])


@needs_corpus
def test_split_lists_cover_every_scenario_file_and_no_vehicle_is_in_two_splits():
    """The corpus repeats recordings under several file names (USA_US101-10_1, -10_3, -10_4 log the
    same traffic) and cuts windows that share vehicles; such files share a split."""
    scenarios = corpus_scenarios(NGSIM)
    lists = read_splits(SPLITS_DIR, "ngsim", scenarios)
    assert sorted(s for split in SPLITS for s in lists[split]) == sorted(scenarios)
    split_of = {s: split for split in SPLITS for s in lists[split]}
    groups = scenario_groups(NGSIM, scenarios)
    assert any({"US101/USA_US101-10_1_T-1.xml", "US101/USA_US101-10_3_T-1.xml"} <= set(g) for g in groups)
    for group in groups:
        assert len({split_of[s] for s in group}) == 1, group
    assert make_splits(scenarios, groups) == lists  # the committed lists are what make_splits gives


def test_splits_keep_groups_together_and_repeated_vehicles_are_converted_once(tmp_path):
    """make_splits on made-up groups: a group is never split, test holds at least a quarter of each
    road, both roads in every split."""
    files = [f"{road}/s{k:02d}.xml" for road in CORPORA["ngsim"] for k in range(20)]
    groups = [files[i:i + 3] for i in range(0, 18, 3)] + [files[18:20]]
    groups += [files[20 + i:20 + i + 2] for i in range(0, 20, 2)]
    lists = make_splits(files, groups)
    split_of = {s: split for split in SPLITS for s in lists[split]}
    for g in groups:
        assert len({split_of[s] for s in g}) == 1
    for split in SPLITS:
        assert {road_of(s) for s in lists[split]} == set(CORPORA["ngsim"])
    for road in CORPORA["ngsim"]:
        assert sum(road_of(s) == road for s in lists["test"]) >= 5
    with pytest.raises(CorpusError, match="every scenario file exactly once"):
        make_splits(files, groups[1:])


def test_a_bad_split_list_is_named(tmp_path):
    for split in SPLITS:
        (tmp_path / f"ngsim_{split}.txt").write_text((SPLITS_DIR / f"ngsim_{split}.txt").read_text())
    test = tmp_path / "ngsim_test.txt"
    test.write_text(test.read_text() + (SPLITS_DIR / "ngsim_train.txt").read_text().splitlines()[0] + "\n")
    with pytest.raises(CorpusError, match=r"ngsim_test\.txt:\d+: .* is already listed in .*ngsim_train\.txt"):
        read_splits(tmp_path, "ngsim")
    test.write_text("I80/USA_I80-1_1_T-1.xml\n")
    with pytest.raises(CorpusError, match=r"ngsim_test\.txt:1: 'I80/USA_I80-1_1_T-1.xml' is not <road>"):
        read_splits(tmp_path, "ngsim")
    test.unlink()
    with pytest.raises(CorpusError, match="no such split list"):
        read_splits(tmp_path, "ngsim")


@needs_corpus
def test_real_scenarios_convert_into_clips_the_simulator_accepts(tmp_path):
    """Every vehicle of two real scenes as the ego: the qualifying ones convert (the target is 99 %),
    each once although one scene is in the corpus twice, every clip's route follows its driver, and the
    simulator starts an episode of each and replays the expert through its first steps."""
    from bev_warp_sim.preflight import check_split
    from bev_warp_sim.reference_policies import make_policy
    from bev_warp_sim.rollout import PerRowPlanners, run_rollouts

    report = convert_corpus(NGSIM, SPLITS_DIR, tmp_path, only=SAMPLE, progress=False, params=LOG_PARAMS)
    assert report.qualifying > 50 and report.acceptance >= 0.99, report.lines()
    assert sum(report.not_qualifying.values()) + report.duplicates + report.qualifying == report.vehicles
    assert report.duplicates >= 20  # USA_US101-10_3 logs the vehicles of USA_US101-10_1 again
    written = {split: read_index(tmp_path / split)["num_clips"] for split in SPLITS}
    assert sum(written.values()) == report.converted
    sim = _simulator()
    clips = []
    for split in SPLITS:
        checked = check_split(tmp_path / split, sim)
        assert not checked.refused, [str(r) for r in checked.refused]
        clips += checked.clips
    assert {c.metadata["road"] for c in clips} == {"US101", "Lankershim"}
    for clip in clips:
        assert clip.metadata["source"] == "commonroad" and clip.metadata["scenario_file"] in SAMPLE
        assert clip.duration_s >= 5.0 - 1e-9
    rollouts, _ = run_rollouts(sim, PerRowPlanners(lambda: make_policy("expert", PARAMS)), clips,
                               max_steps=20)
    assert len(rollouts) == len(clips) and not any(r.trace.offroad for r in rollouts)
    # the tracked replay of a log leaves it by up to about a metre where NGSIM's heading jitters (10-15 deg
    # between samples in Lankershim's junctions); two of these 62 egos then touch a car logged 0.8-1 m
    # beside them, every other replay is collision-free
    assert sum(r.trace.collided for r in rollouts) <= 0.05 * len(rollouts)
    # a subset drawn twice is the same subset
    a = bundle_subset(tmp_path / SPLITS[0] if written["train"] else tmp_path / "test", tmp_path / "a", 3,
                      progress=False)
    b = bundle_subset(tmp_path / SPLITS[0] if written["train"] else tmp_path / "test", tmp_path / "b", 3,
                      progress=False)
    assert a == b and (tmp_path / "a" / "clips.txt").read_text().split() == a


def test_bundled_eval_real_is_test_split_clips_the_simulator_drives():
    """data/eval_real: clips of both roads, all from test-split scenario files, listed in clips.txt, each
    accepted by the simulator and driven by the expert replay for a few steps."""
    from bev_warp_sim.preflight import check_split
    from bev_warp_sim.reference_policies import make_policy
    from bev_warp_sim.rollout import PerRowPlanners, run_rollouts

    test_files = set(read_splits(SPLITS_DIR, "ngsim")["test"])
    listed = (EVAL_REAL / "clips.txt").read_text().split()
    index = read_index(EVAL_REAL)
    assert sorted(e["clip_id"] for e in index["clips"]) == sorted(listed) and 40 <= len(listed) <= 60
    sim = _simulator()
    checked = check_split(EVAL_REAL, sim)
    assert not checked.refused, [str(r) for r in checked.refused]
    roads = set()
    for clip in iter_dataset(EVAL_REAL):
        assert clip.metadata["scenario_file"] in test_files and clip.metadata["split"] == "test"
        roads.add(clip.metadata["road"])
    assert roads == {"US101", "Lankershim"}
    expert = PerRowPlanners(lambda: make_policy("expert", PARAMS))
    rollouts, _ = run_rollouts(sim, expert, checked.clips, max_steps=10)
    assert len(rollouts) == len(listed)
    assert all(np.isfinite(r.trace.ego).all() for r in rollouts)
