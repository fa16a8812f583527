"""Every benchmark and training CLI answers --help without side effects (usage on stdout, exit 0)."""

from __future__ import annotations

import argparse
import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

TOOLS = Path(__file__).resolve().parents[2] / "tools"


@pytest.mark.parametrize("tool", ["bench_all.py", "bench_planner_latency.py", "bench_ilqr.py", "bench_sim.py",
                                  "bench_rollouts.py", "train_rl.py", "rl_experiments.py",
                                  "evaluate_policy.py", "train_self_correction.py", "eval_safety_layer.py",
                                  "finetune_self_correction.py", "merge_datasets.py", "bench_graph.py"])
def test_help(tool, tmp_path):
    res = subprocess.run([sys.executable, str(TOOLS / tool), "--help"], capture_output=True, text=True,
                         timeout=120, cwd=tmp_path)
    assert res.returncode == 0 and "usage:" in res.stdout, res.stderr
    assert not any(tmp_path.iterdir())  # --help writes nothing


@pytest.mark.parametrize("tool,args,name", [
    ("train_rl.py", ["--workers", "-1"], "--workers"),
    ("train_rl.py", ["--budget-min", "0"], "--budget-min"),
    ("rl_experiments.py", ["--max-clips", "0"], "--max-clips"),
    ("rl_experiments.py", ["--arms", "il:best"], "il:best"),
    ("rl_experiments.py", ["--merge", "nowhere.json"], "--merge"),
    ("rl_experiments.py", ["--rename", "a->b"], "--rename"),
    ("rl_experiments.py", ["--threads", "0"], "--threads"),
    ("rl_experiments.py", ["--sim-set", "sim.reactive_agents=perhaps"], "sim.reactive_agents"),
    ("rl_experiments.py", ["--merge", "r.json", "--sim-set", "sim.max_steps=5"], "--sim-set"),
    ("train_rl.py", ["--sim-set", "sim.made_up=1"], "sim.made_up"),
    ("rl_experiments.py", ["--sim-set", "sim.dt=0.2"], "controller.dt"),  # in range, yet not the log's step
    ("rl_experiments.py", ["--device", "cuda"], "--backend pytorch"),
    ("bench_rollouts.py", ["--backend", "pytorch", "--device", "gpu0"], "--device"),
    ("bench_planner_latency.py", ["--cuda-graphs", "maybe"], "--cuda-graphs"),
    ("bench_planner_latency.py", ["--cycles", "0"], "--cycles"),
    ("bench_planner_latency.py", ["--m", "32", "0"], "--m"),
    ("bench_planner_latency.py", ["--op-profile", "--m", "32", "64"], "--op-profile"),
    ("bench_planner_latency.py", ["--op-profile", "--backend", "pytorch"], "--op-profile"),
    # 0 steps used to run silently with the default K; bounds come from params/planner.schema.yaml
    ("bench_planner_latency.py", ["--k", "0"], "planner.num_denoise_steps"),
    ("bench_planner_latency.py", ["--m", "2000"], "planner.num_candidates"),
    ("bench_planner_latency.py", ["--sampler", "euler"], "planner.sampler"),
    ("bench_planner_latency.py", ["--device", "-1"], "--device"),
    ("bench_planner_latency.py", ["--m", "4", "--data", "nowhere"], "nowhere"),
    ("bench_ilqr.py", ["--repeats", "0"], "--repeats"),
    ("bench_ilqr.py", ["--seed", "-1"], "--seed"),
    ("bench_sim.py", ["--batch", "-1"], "--batch"),
    ("bench_sim.py", ["--dataset", "nowhere"], "nowhere"),
    ("bench_bev.py", ["--stride", "0"], "--stride"),
    ("bench_graph.py", ["--domain-id", "999"], "--domain-id"),
    ("demo.py", ["--backend", "gpu"], "planner.backend"),
    ("demo.py", ["--realtime-factor", "1e6"], "node.realtime_factor"),
    ("soak_faults.py", ["--dataset", "/nonexistent_dataset", "--minutes", "0.01"], "/nonexistent_dataset"),
    ("evaluate_policy.py", ["--h-reuse", "100000"], "evaluation.h_reuse"),
    ("evaluate_policy.py", ["--seed", "-1"], "rollout.seed"),
    ("evaluate_policy.py", ["--backend", "tflite"], "planner.backend"),
    ("evaluate_policy.py", ["--openvino-precision", "bf16"], "the openvino backend"),
    ("bench_planner_latency.py", ["--backend", "openvino", "--openvino-precision", "fp8"],
     "runtime.openvino.precision"),
    ("latency_report.py", ["--duration", "nan"], "--duration"),
    ("rl_experiments.py", ["--seeds", "0", "-1"], "--seeds"),
    ("train_rl.py", ["--seed", "-1"], "rl.seed"),
    ("train_il.py", ["--seed", "-1"], "imitation.seed"),
    ("train_critic.py", ["--lr", "nan"], "--lr"),
    ("bench_rollouts.py", ["--group", "0"], "rollout.group_size"),
    ("bench_rollouts.py", ["--openvino-precision", "bf16"], "--backend openvino"),
    ("curate_scenarios.py", ["--seed", "-1"], "rollout.seed"),
    ("eval_safety_layer.py", ["--splits", str(TOOLS.parent / "data" / "eval_safety"), "--critic",
                              "/nonexistent_critic"], "/nonexistent_critic"),
    ("replay_eval.py", ["--rate", "0"], "--rate"),
    ("smoke_graph.py", ["--domain-id", "999"], "--domain-id"),
    ("record_bag.py", ["--duration", "inf"], "--duration"),
    ("bench_all.py", ["--cycles", "0"], "--cycles"),
    ("bench_graph.py", ["--cycles", "0"], "--cycles"),
    ("bench_graph.py", ["--rate-hz", "0"], "--rate-hz"),
    ("bench_graph.py", ["--data", "nowhere"], "--data"),
    ("train_self_correction.py", ["--data", str(TOOLS.parent / "data" / "train"), "--out", "o", "--set",
                                  "trace_len=0"],
     "self_correction.trace_len"),
    ("eval_safety_layer.py", ["--merge", "nowhere"], "--merge"),
    ("train_self_correction.py", ["--data", "nowhere", "--out", "o"], "--data"),
    ("finetune_self_correction.py", ["--data", str(TOOLS.parent / "data" / "train"), "--out", "o", "--set",
                                     "kl_weight=-1"], "self_correction_rl.kl_weight"),
    ("finetune_self_correction.py", ["--data", "nowhere"], "--data"),
    ("finetune_self_correction.py", ["--data", str(TOOLS.parent / "data" / "train"),
                                     "--time-budget-min", "nan"], "--time-budget-min"),
    ("train_self_correction.py", ["--data", str(TOOLS.parent / "data" / "train"), "--out", "o",
                                  "--time-budget-min", "-1"], "--time-budget-min"),
    ("finetune_self_correction.py", ["--data", str(TOOLS.parent / "data" / "train"), "--set", "iterations"],
     "--set 'iterations'"),
])
def test_bad_arguments_are_named(tool, args, name, tmp_path):
    res = subprocess.run([sys.executable, str(TOOLS / tool), *args], capture_output=True, text=True,
                         timeout=120, cwd=tmp_path)
    assert res.returncode == 2 and name in res.stderr and "Traceback" not in res.stderr, res.stderr


def test_merge_datasets_keeps_every_clip_and_refuses_repeated_ids(tmp_path):
    from rad2_core.storage import iter_dataset, read_index

    data = TOOLS.parent / "data"
    merge = [sys.executable, str(TOOLS / "merge_datasets.py")]
    res = subprocess.run([*merge, str(data / "eval_signals"), str(data / "eval_rich"), "--out", "m"],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    want = [e["clip_id"] for d in ("eval_signals", "eval_rich") for e in read_index(data / d)["clips"]]
    got = read_index(tmp_path / "m")
    assert [e["clip_id"] for e in got["clips"]] == want and got["num_clips"] == len(want)
    first = next(iter_dataset(tmp_path / "m"))  # clips load with their maps from the merged directory
    assert first.clip_id == want[0]
    res = subprocess.run([*merge, str(data / "eval_signals"), str(data / "eval_signals"), "--out", "d"],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert res.returncode == 2 and "clip_id" in res.stderr and not (tmp_path / "d").exists(), res.stderr
    res = subprocess.run([*merge, "nowhere", "--out", "e"], capture_output=True, text=True, timeout=120,
                         cwd=tmp_path)
    assert res.returncode == 2 and "nowhere" in res.stderr and "Traceback" not in res.stderr, res.stderr
    # a corrupt clip: named, non-zero exit, no half-merged dataset left
    shutil.copytree(data / "eval_signals", tmp_path / "bad")
    bad = tmp_path / "bad" / read_index(tmp_path / "bad")["clips"][-1]["file"]
    bad.write_bytes(b"not an npz")
    res = subprocess.run([*merge, str(data / "eval_rich"), "bad", "--out", "f"], capture_output=True,
                         text=True, timeout=300, cwd=tmp_path)
    assert res.returncode == 1 and bad.name in res.stderr and "Traceback" not in res.stderr, res.stderr
    assert not (tmp_path / "f").exists() and not (tmp_path / "f.partial").exists()


def test_rl_experiments_merges_runs_and_renames_arms(tmp_path):
    import json

    def run(cr):
        return {"ckpt:/mnt/x@D=safe": {"/elsewhere/data/eval_safety": [
            {"CR": cr, "AF-CR": 0.0, "Safety@1": 1 - cr, "comfort_violation_steps": 0.2}]}}

    for i, cr in enumerate((0.1, 0.3)):
        (tmp_path / f"r{i}.json").write_text(json.dumps(run(cr)))
    res = subprocess.run([sys.executable, str(TOOLS / "rl_experiments.py"), "--merge", "r0.json", "r1.json",
                          "--rename", "ckpt:/mnt/x@D=safe->RL run", "--out", "m"], capture_output=True,
                         text=True, timeout=120, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    table = (tmp_path / "m" / "experiments.md").read_text()
    assert "| RL run | 0.200 ± 0.100 |" in table and "2 per cell" in table
    assert (tmp_path / "m" / "experiments.png").is_file()


def test_fixed_shapes_comparison_alternates_both_settings(tmp_path):
    """bench_planner_latency.py --compare-fixed-shapes: both settings timed in one process, per M."""
    import json

    out = tmp_path / "cmp"
    res = subprocess.run([sys.executable, str(TOOLS / "bench_planner_latency.py"), "--compare-fixed-shapes",
                          "--m", "4", "--cycles", "3", "--warmup", "1", "--random-inputs", "--out", str(out)],
                         capture_output=True, text=True, timeout=300, cwd=TOOLS.parent)
    assert res.returncode == 0, res.stderr
    payload = json.loads((tmp_path / "cmp_fixed_shapes.json").read_text())
    assert payload["key"] == "ort_fixed_shapes" and payload["values"] == ["False", "True"]
    cells = payload["results"]["4"]
    assert set(cells) == {"False", "True"} and all(c["median"] > 0 for c in cells.values())
    assert "M=   4" in res.stdout


def test_operator_profile_cli_writes_the_table_the_figure_and_the_traces(tmp_path):
    """bench_planner_latency.py --op-profile: ONNX Runtime's operator time per graph, with the matrix
    products' throughput set against the probe of the same run."""
    import json

    out = tmp_path / "prof"
    res = subprocess.run([sys.executable, str(TOOLS / "bench_planner_latency.py"), "--op-profile", "--m", "8",
                          "--cycles", "3", "--random-inputs", "--out", str(out)],
                         capture_output=True, text=True, timeout=300, cwd=TOOLS.parent)
    assert res.returncode == 0, res.stderr
    payload = json.loads((tmp_path / "prof_ops.json").read_text())
    profile = payload["profile"]
    assert payload["num_candidates"] == 8 and profile["cycles"] == 3
    assert "generator" in profile["graphs"] and profile["matrix"]["gflop_per_cycle"] > 0
    assert {"torch", "onnxruntime"} <= set(payload["run"]["probe_by_library"])
    assert (tmp_path / "prof_ops.png").is_file() and list((tmp_path / "prof_ops").glob("generator_*.json"))
    assert "matrix products" in res.stdout and "every other operator" in res.stdout


class _Parsed(Exception):
    """Raised instead of parsing: the tool's parser has been built and captured."""


def _tool_parser(tool: Path, monkeypatch) -> argparse.ArgumentParser:
    """The parser ``tool``'s main() builds, captured at its first parse_args (nothing runs after it)."""
    captured = {}

    def capture(self, *args, **kwargs):
        captured["parser"] = self
        raise _Parsed

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", capture)
    monkeypatch.setattr(sys, "argv", [str(tool)])
    monkeypatch.syspath_prepend(str(TOOLS))  # as when run: a tool may import a sibling (convert_womd)
    spec = importlib.util.spec_from_file_location(f"tool_{tool.stem}", tool)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with pytest.raises(_Parsed):
        module.main()
    return captured["parser"]


def test_every_numeric_option_of_every_tool_is_bounded(monkeypatch):
    """No tool takes a bare int/float: those accept nan, inf, 1e300 and negative counts, which then fail
    deep inside (or silently run with nonsense). Each numeric option uses rad2_core.cli_args, and
    each of those refuses a non-finite value."""
    bare, accepts_nan, checked = [], [], 0
    for tool in sorted(TOOLS.glob("*.py")):
        if tool.name == "rosenv.py":  # runs under `python -S` (tools/env.sh), so without the package;
            continue                  # its one number, --domain-id, is checked by rosenv itself
        for action in _tool_parser(tool, monkeypatch)._actions:
            if action.type in (int, float):
                bare.append(f"{tool.name} {action.option_strings}")
            elif getattr(action.type, "__module__", "") == "rad2_core.cli_args":
                checked += 1
                try:
                    action.type("nan")
                    accepts_nan.append(f"{tool.name} {action.option_strings}")
                except argparse.ArgumentTypeError:
                    pass
    assert not bare, bare
    assert not accepts_nan, accepts_nan
    assert checked > 80  # the tools' numeric options, all of them seen
