"""Replay a short converted clip through the real perception-features and planner node processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from rad2_planner import bags
from rad2_planner.clip import save_clip
from synthetic_scenes import make_clip

ROOT = Path(__file__).resolve().parents[1]
TOOLS = ROOT / "tools"
NODES = ROOT / "ros2_ws" / "src" / "rad2_planner" / "rad2_planner" / "nodes"
INSTALL_LIB = ROOT / "ros2_ws" / "install" / "rad2_planner" / "lib" / "rad2_planner"
STEPS = 12

_missing = [p.name for p in (NODES / "perception_node.py", NODES / "planner_node.py") if not p.is_file()]
if not _missing and not (INSTALL_LIB / "planner_node").exists():
    _missing = [f"{INSTALL_LIB}/planner_node (run tools/bootstrap.sh)"]
if not _missing:
    from rad2_planner.config import load_params

    _ckpt = ROOT / load_params("planner")["planner"]["checkpoint_dir"]
    if not _ckpt.is_dir() or not any(_ckpt.iterdir()):
        _missing = [f"planner checkpoint {_ckpt} (planner.checkpoint_dir; train or fetch it first)"]
needs_nodes = pytest.mark.skipif(
    bool(_missing), reason=f"replay needs the perception and planner nodes; missing: {_missing}")


@needs_nodes
def test_replay_lock_step_through_real_nodes(tmp_path):
    clip = make_clip(num_steps=41)
    clip_file = save_clip(clip, tmp_path / "clip.npz")
    res = subprocess.run([sys.executable, str(TOOLS / "clip_to_bag.py"), "--clip", str(clip_file),
                          "--steps", "0:30", "--out", str(tmp_path / "in")],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    out = tmp_path / "replay"
    res = subprocess.run([sys.executable, str(TOOLS / "replay_eval.py"), "--bag", str(tmp_path / "in"),
                          "--out", str(out), "--max-steps", str(STEPS), "--domain-id",
                          str(100 + os.getpid() % 50)],
                         capture_output=True, text=True, timeout=85)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    report = json.loads((out / "replay_eval.json").read_text())
    # lock-step: every step got its plan, matched by stamp
    assert report["steps"] == STEPS
    assert report["plans_received"] == STEPS, report
    assert report["unmatched_outputs"] == 0
    ol = report["open_loop"]
    assert ol["cycles_with_candidates"] == STEPS
    planner = report["diagnostics"]["planner"]
    assert planner["messages"] >= STEPS
    assert planner["stages"]["end_to_end"]["count"] >= STEPS
    assert report["wall_latency_ms"]["count"] == STEPS and report["wall_latency_ms"]["p50"] > 0
    for png in ("plans.png", "timeline.png", "latency.png"):
        assert (out / png).stat().st_size > 5_000, png
    # the output bag holds the replayed inputs and the planner outputs, with standard schemas
    with bags.BagReader(out / "outputs") as reader:
        topics = reader.topics
    assert topics["/planning/candidates"].count == STEPS
    assert topics["/planning/path"].msgtype == "nav_msgs/msg/Path"
    assert topics["/localization/odometry"].count == STEPS
    assert topics["/planning/diagnostics"].msgtype == "rad2_msgs/msg/PlanningDiagnostics"


def test_replay_rejects_bag_without_inputs(tmp_path):
    with bags.BagWriter(tmp_path / "empty") as w:
        w.write("/other", bags.new_message("std_msgs/msg/String", data="x"), 1)
    res = subprocess.run([sys.executable, str(TOOLS / "replay_eval.py"), "--bag", str(tmp_path / "empty"),
                          "--out", str(tmp_path / "o")], capture_output=True, text=True, timeout=60)
    assert res.returncode == 2
    assert "no topic" in res.stderr and "/localization/odometry" in res.stderr
