"""rad2 eval policy on bad input and across interruptions: a clip the simulator refuses is named before any
rollout (and the run stops), --skip-bad drives the others and reports the skip, and a run killed after its
first finished clip resumes to the table of an uninterrupted run, in this process or on Ray workers."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from rad2_core.storage import load_dataset, save_dataset

ROOT = Path(__file__).resolve().parents[2]
TOOL = [sys.executable, "-m", "rad2_bringup.cli", "eval", "policy"]
# two reference policies, one clip per chunk: six chunks, so a kill after the first lands mid-run
RUN = ["--policy", "idm", "expert", "--batch-size", "1", "--gifs", "1", "--no-progress"]


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    """Three clips of data/eval_safety as they are, and the same three with the second one's route
    reversed (the logged ego's progress along it runs backward: the simulator refuses it)."""
    base = tmp_path_factory.mktemp("datasets")
    clips = load_dataset(ROOT / "data" / "eval_safety")[:3]
    save_dataset(clips, base / "good")
    reversed_route = np.ascontiguousarray(clips[1].route_polyline[::-1])
    save_dataset([clips[0], dataclasses.replace(clips[1], route_polyline=reversed_route), clips[2]],
                 base / "one_bad")
    return {"good": base / "good", "one_bad": base / "one_bad", "bad_id": clips[1].clip_id}


def _run(*args, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run([*TOOL, *map(str, args)], capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def _episodes(out: Path) -> dict:
    """{(policy, split name, clip id): episode} of a results.json, and the metrics per (policy, split)."""
    data = json.loads((out / "results.json").read_text())
    episodes = {(e["policy"], Path(e["split"]).name, ep["clip_id"]): ep for e in data for ep in e["episodes"]}
    metrics = {(e["policy"], Path(e["split"]).name): e["metrics"] for e in data}
    return {"episodes": episodes, "metrics": metrics}


def test_a_refused_clip_is_named_before_any_rollout(datasets, tmp_path):
    out = tmp_path / "eval"
    res = _run("--split", datasets["one_bad"], "--out", out, *RUN)
    assert res.returncode != 0
    assert datasets["bad_id"] in res.stderr and "route" in res.stderr and "--skip-bad" in res.stderr
    # nothing was driven: no episode written, no result
    assert not (out / "episodes.jsonl").exists() and not (out / "results.json").exists()


def test_skip_bad_drives_the_others_and_reports_the_skip(datasets, tmp_path):
    out = tmp_path / "eval"
    res = _run("--split", datasets["one_bad"], "--out", out, "--policy", "idm", "--gifs", "0",
               "--no-progress", "--skip-bad")
    assert res.returncode == 0, res.stderr
    data = json.loads((out / "results.json").read_text())
    assert [ep["clip_id"] for ep in data[0]["episodes"]] == [c for c in _ids(datasets["good"])
                                                           if c != datasets["bad_id"]]
    (skipped,) = data[0]["skipped"]
    assert skipped["clip_id"] == datasets["bad_id"] and "route" in skipped["reason"]
    assert "Skipped 1 clip(s) the simulator refused" in res.stdout and datasets["bad_id"] in res.stdout
    assert datasets["bad_id"] in (out / "table.md").read_text()
    assert (out / "summary_one_bad.png").is_file()


def test_skip_bad_renders_the_worst_clips_where_a_clip_file_does_not_load(datasets, tmp_path):
    """A split whose index names a clip file that is not there: --skip-bad drives the others, and the
    GIFs of the worst of them are rendered without loading the missing one."""
    import shutil

    split = tmp_path / "one_missing"
    shutil.copytree(datasets["good"], split)
    index = json.loads((split / "index.json").read_text())
    index["clips"].insert(0, {**index["clips"][0], "clip_id": "gone", "file": "clips/gone.npz"})
    index["num_clips"] = len(index["clips"])
    (split / "index.json").write_text(json.dumps(index))
    out = tmp_path / "eval"
    res = _run("--split", split, "--out", out, "--policy", "idm", "--gifs", "1", "--max-clips", "2",
               "--no-progress", "--skip-bad")
    assert res.returncode == 0, res.stderr
    data = json.loads((out / "results.json").read_text())
    assert "gone" in [s["clip_id"] for s in data[0]["skipped"]]
    assert len(list((out / "gifs").glob("idm_one_missing_*.gif"))) == 1


def _ids(split: Path) -> list[str]:
    return [e["clip_id"] for e in json.loads((split / "index.json").read_text())["clips"]]


def _kill_after_first_episode(args: list, out: Path) -> int:
    """Start an evaluation, SIGKILL it as soon as its first finished clip is in episodes.jsonl; the number
    of episode lines it left."""
    proc = subprocess.Popen([*TOOL, *map(str, args)], cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    log = out / "episodes.jsonl"
    deadline = time.monotonic() + 240
    try:
        while not (log.is_file() and log.read_text().count("\n") >= 1):
            assert proc.poll() is None, f"the evaluation ended before its first episode: {proc.stderr.read()}"
            assert time.monotonic() < deadline, "no episode written in 240 s"
            time.sleep(0.02)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)  # its Ray workers too, as an interruption would
        proc.wait(timeout=60)
    return log.read_text().count("\n")


@pytest.mark.parametrize("workers", [0, 1], ids=["in_process", "ray_workers"])
def test_a_killed_run_resumes_to_the_uninterrupted_table(datasets, tmp_path, workers):
    split = datasets["good"]
    killed, whole = tmp_path / "killed", tmp_path / "whole"
    common = ["--split", split, *RUN, "--workers", workers]
    left = _kill_after_first_episode([*common, "--out", killed], killed)
    assert 1 <= left < 6, f"the kill came too late to test a resume ({left} of 6 episodes were done)"
    res = _run(*common, "--out", killed, "--resume")
    assert res.returncode == 0, res.stderr
    assert "read back from the earlier run" in res.stdout
    res = _run(*common, "--out", whole)
    assert res.returncode == 0, res.stderr
    resumed, uninterrupted = _episodes(killed), _episodes(whole)
    assert set(resumed["episodes"]) == set(uninterrupted["episodes"]) and len(resumed["episodes"]) == 6
    for key, episode in uninterrupted["episodes"].items():
        assert resumed["episodes"][key] == episode, key  # every per-clip metric, exactly
    assert resumed["metrics"] == uninterrupted["metrics"]
    # each episode once in the log, and the worst clips' GIFs as the uninterrupted run drew them
    assert (killed / "episodes.jsonl").read_text().count("\n") == 6
    assert sorted(p.name for p in (killed / "gifs").glob("*.gif")) == \
        sorted(p.name for p in (whole / "gifs").glob("*.gif"))


def test_resume_refuses_other_settings_by_name(datasets, tmp_path):
    out = tmp_path / "eval"
    one = ["--split", datasets["good"], "--out", out, "--policy", "idm", "--max-clips", "1", "--gifs", "0",
           "--no-progress"]
    res = _run(*one)
    assert res.returncode == 0, res.stderr
    res = _run(*one, "--resume", "--h-reuse", "2")
    assert res.returncode == 2
    assert "h_reuse: was 1, now 2" in res.stderr
