"""The rad2 command (rad2_bringup.cli): the groups and verbs, --help of every verb without side effects
(usage on stdout, exit 0, an example), bad groups, verbs and options named (exit 2), and the verbs that
merge results or datasets and compare runtime settings, run as processes."""

from __future__ import annotations

import argparse
import importlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from rad2_bringup.cli import COMMANDS, main, verbs

ROOT = Path(__file__).resolve().parents[2]
RAD2 = [sys.executable, "-m", "rad2_bringup.cli"]


@pytest.mark.parametrize("tool", ["bench all", "bench planner", "bench ilqr", "bench sim",
                                  "bench rollouts", "train rl", "eval experiments",
                                  "eval policy", "train self-correction", "eval safety-layer",
                                  "train self-correction-rl", "data merge", "data mirror", "bench graph"])
def test_help(tool, tmp_path):
    res = subprocess.run([*RAD2, *tool.split(), "--help"], capture_output=True, text=True,
                         timeout=120, cwd=tmp_path)
    assert res.returncode == 0 and "usage:" in res.stdout, res.stderr
    assert not any(tmp_path.iterdir())  # --help writes nothing


@pytest.mark.parametrize("tool,args,name", [
    ("train rl", ["--workers", "-1"], "--workers"),
    ("train rl", ["--budget-min", "0"], "--budget-min"),
    ("eval experiments", ["--max-clips", "0"], "--max-clips"),
    ("eval experiments", ["--arms", "il:best"], "il:best"),
    ("eval experiments", ["--merge", "nowhere.json"], "--merge"),
    ("eval experiments", ["--rename", "a->b"], "--rename"),
    ("eval experiments", ["--threads", "0"], "--threads"),
    ("eval experiments", ["--sim-set", "sim.reactive_agents=perhaps"], "sim.reactive_agents"),
    ("eval experiments", ["--merge", "r.json", "--sim-set", "sim.max_steps=5"], "--sim-set"),
    ("train rl", ["--sim-set", "sim.made_up=1"], "sim.made_up"),
    ("eval experiments", ["--sim-set", "sim.dt=0.2"], "controller.dt"),  # in range, yet not the log's step
    ("eval experiments", ["--device", "cuda"], "--backend pytorch"),
    ("bench rollouts", ["--backend", "pytorch", "--device", "gpu0"], "--device"),
    ("bench planner", ["--cuda-graphs", "maybe"], "--cuda-graphs"),
    ("bench planner", ["--cycles", "0"], "--cycles"),
    ("bench planner", ["--m", "32", "0"], "--m"),
    ("bench planner", ["--op-profile", "--m", "32", "64"], "--op-profile"),
    ("bench planner", ["--op-profile", "--backend", "pytorch"], "--op-profile"),
    # 0 steps used to run silently with the default K; bounds come from params/planner.schema.yaml
    ("bench planner", ["--k", "0"], "planner.num_denoise_steps"),
    ("bench planner", ["--m", "2000"], "planner.num_candidates"),
    ("bench planner", ["--sampler", "euler"], "planner.sampler"),
    ("bench planner", ["--device", "-1"], "--device"),
    ("bench planner", ["--m", "4", "--data", "nowhere"], "nowhere"),
    ("bench ilqr", ["--repeats", "0"], "--repeats"),
    ("bench ilqr", ["--seed", "-1"], "--seed"),
    ("bench sim", ["--batch", "-1"], "--batch"),
    ("bench sim", ["--dataset", "nowhere"], "nowhere"),
    ("bench bev", ["--stride", "0"], "--stride"),
    ("bench graph", ["--domain-id", "999"], "--domain-id"),
    ("demo", ["--backend", "gpu"], "planner.backend"),
    ("demo", ["--realtime-factor", "1e6"], "node.realtime_factor"),
    ("graph soak", ["--dataset", "/nonexistent_dataset", "--minutes", "0.01"], "/nonexistent_dataset"),
    ("eval policy", ["--h-reuse", "100000"], "evaluation.h_reuse"),
    ("eval policy", ["--seed", "-1"], "rollout.seed"),
    ("eval policy", ["--backend", "tflite"], "planner.backend"),
    ("eval policy", ["--openvino-precision", "bf16"], "the openvino backend"),
    ("bench planner", ["--backend", "openvino", "--openvino-precision", "fp8"],
     "runtime.openvino.precision"),
    ("eval latency-report", ["--duration", "nan"], "--duration"),
    ("eval experiments", ["--seeds", "0", "-1"], "--seeds"),
    ("train rl", ["--seed", "-1"], "rl.seed"),
    ("train il", ["--seed", "-1"], "imitation.seed"),
    ("train critic", ["--lr", "nan"], "--lr"),
    ("bench rollouts", ["--group", "0"], "rollout.group_size"),
    ("bench rollouts", ["--openvino-precision", "bf16"], "--backend openvino"),
    ("data curate", ["--seed", "-1"], "rollout.seed"),
    ("eval safety-layer", ["--splits", str(ROOT / "data" / "eval_safety"), "--critic",
                              "/nonexistent_critic"], "/nonexistent_critic"),
    ("eval replay", ["--rate", "0"], "--rate"),
    ("graph smoke", ["--domain-id", "999"], "--domain-id"),
    ("graph record", ["--duration", "inf"], "--duration"),
    ("bench all", ["--cycles", "0"], "--cycles"),
    ("bench graph", ["--cycles", "0"], "--cycles"),
    ("bench graph", ["--rate-hz", "0"], "--rate-hz"),
    ("bench graph", ["--data", "nowhere"], "--data"),
    ("train self-correction", ["--data", str(ROOT / "data" / "train"), "--out", "o", "--set",
                                  "trace_len=0"],
     "self_correction.trace_len"),
    ("eval safety-layer", ["--merge", "nowhere"], "--merge"),
    ("train self-correction", ["--data", "nowhere", "--out", "o"], "--data"),
    ("train self-correction-rl", ["--data", str(ROOT / "data" / "train"), "--out", "o", "--set",
                                     "kl_weight=-1"], "self_correction_rl.kl_weight"),
    ("train self-correction-rl", ["--data", "nowhere"], "--data"),
    ("train self-correction-rl", ["--data", str(ROOT / "data" / "train"),
                                     "--time-budget-min", "nan"], "--time-budget-min"),
    ("train self-correction", ["--data", str(ROOT / "data" / "train"), "--out", "o",
                                  "--time-budget-min", "-1"], "--time-budget-min"),
    ("train self-correction-rl", ["--data", str(ROOT / "data" / "train"), "--set", "iterations"],
     "--set 'iterations'"),
])
def test_bad_arguments_are_named(tool, args, name, tmp_path):
    res = subprocess.run([*RAD2, *tool.split(), *args], capture_output=True, text=True,
                         timeout=120, cwd=tmp_path)
    assert res.returncode == 2 and name in res.stderr and "Traceback" not in res.stderr, res.stderr


def test_merge_datasets_keeps_every_clip_and_refuses_repeated_ids(tmp_path):
    from rad2_core.storage import iter_dataset, read_index

    data = ROOT / "data"
    merge = [*RAD2, "data", "merge"]
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


def test_mirror_dataset_writes_every_clip_and_leaves_nothing_on_a_bad_one(tmp_path):
    from rad2_core.storage import iter_dataset, read_index

    data = ROOT / "data"
    mirror = [*RAD2, "data", "mirror"]
    res = subprocess.run([*mirror, str(data / "eval_signals"), "--out", "m"], capture_output=True, text=True,
                         timeout=300, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    want = [e["clip_id"] + "_mirrored" for e in read_index(data / "eval_signals")["clips"]]
    assert [e["clip_id"] for e in read_index(tmp_path / "m")["clips"]] == want
    first = next(iter_dataset(tmp_path / "m"))
    assert first.metadata["mirrored"] is True
    # mirrored back: the original ids again
    res = subprocess.run([*mirror, "m", "--out", "back"], capture_output=True, text=True, timeout=300,
                         cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert [e["clip_id"] for e in read_index(tmp_path / "back")["clips"]] == [w[:-9] for w in want]
    res = subprocess.run([*mirror, str(data / "eval_signals"), "--out", "m"], capture_output=True, text=True,
                         timeout=120, cwd=tmp_path)
    assert res.returncode == 2 and "--out" in res.stderr, res.stderr  # never over an existing directory
    shutil.copytree(data / "eval_signals", tmp_path / "bad")
    bad = tmp_path / "bad" / read_index(tmp_path / "bad")["clips"][-1]["file"]
    bad.write_bytes(b"not an npz")
    res = subprocess.run([*mirror, "bad", "--out", "f"], capture_output=True, text=True, timeout=300,
                         cwd=tmp_path)
    assert res.returncode == 1 and bad.name in res.stderr and "Traceback" not in res.stderr, res.stderr
    assert not (tmp_path / "f").exists() and not (tmp_path / "f.partial").exists()


def test_rl_experiments_merges_runs_and_renames_arms(tmp_path):
    import json

    def run(cr):
        return {"ckpt:/mnt/x@D=safe": {"/elsewhere/data/eval_safety": [
            {"CR": cr, "AF-CR": 0.0, "Safety@1": 1 - cr, "comfort_violation_steps": 0.2}]}}

    for i, cr in enumerate((0.1, 0.3)):
        (tmp_path / f"r{i}.json").write_text(json.dumps(run(cr)))
    res = subprocess.run([*RAD2, "eval", "experiments", "--merge", "r0.json", "r1.json",
                          "--rename", "ckpt:/mnt/x@D=safe->RL run", "--out", "m"], capture_output=True,
                         text=True, timeout=120, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    table = (tmp_path / "m" / "experiments.md").read_text()
    assert "| RL run | 0.200 ± 0.100 |" in table and "2 per cell" in table
    assert (tmp_path / "m" / "experiments.png").is_file()


def test_fixed_shapes_comparison_alternates_both_settings(tmp_path):
    """rad2 bench planner --compare-fixed-shapes: both settings timed in one process, per M."""
    import json

    out = tmp_path / "cmp"
    res = subprocess.run([*RAD2, "bench", "planner", "--compare-fixed-shapes",
                          "--m", "4", "--cycles", "3", "--warmup", "1", "--random-inputs", "--out", str(out)],
                         capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert res.returncode == 0, res.stderr
    payload = json.loads((tmp_path / "cmp_fixed_shapes.json").read_text())
    assert payload["key"] == "ort_fixed_shapes" and payload["values"] == ["False", "True"]
    cells = payload["results"]["4"]
    assert set(cells) == {"False", "True"} and all(c["median"] > 0 for c in cells.values())
    assert "M=   4" in res.stdout


def test_operator_profile_cli_writes_the_table_the_figure_and_the_traces(tmp_path):
    """rad2 bench planner --op-profile: ONNX Runtime's operator time per graph, with the matrix
    products' throughput set against the probe of the same run."""
    import json

    out = tmp_path / "prof"
    res = subprocess.run([*RAD2, "bench", "planner", "--op-profile", "--m", "8",
                          "--cycles", "3", "--random-inputs", "--out", str(out)],
                         capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert res.returncode == 0, res.stderr
    payload = json.loads((tmp_path / "prof_ops.json").read_text())
    profile = payload["profile"]
    assert payload["num_candidates"] == 8 and profile["cycles"] == 3
    assert "generator" in profile["graphs"] and profile["matrix"]["gflop_per_cycle"] > 0
    assert {"torch", "onnxruntime"} <= set(payload["run"]["probe_by_library"])
    assert (tmp_path / "prof_ops.png").is_file() and list((tmp_path / "prof_ops").glob("generator_*.json"))
    assert "matrix products" in res.stdout and "every other operator" in res.stdout


class _Parsed(Exception):
    """Raised instead of parsing: the verb's parser has been built and captured."""


def _verb_parser(module: str, monkeypatch) -> argparse.ArgumentParser:
    """The parser ``rad2_bringup.cli.<module>``'s main() builds, captured at its first parse_args (nothing
    runs after it)."""
    captured = {}

    def capture(self, *args, **kwargs):
        captured["parser"] = self
        raise _Parsed

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", capture)
    verb = importlib.import_module(f"rad2_bringup.cli.{module}")
    with pytest.raises(_Parsed):
        verb.main([])
    return captured["parser"]


def test_every_numeric_option_of_every_verb_is_bounded(monkeypatch):
    """No verb takes a bare int/float: those accept nan, inf, 1e300 and negative counts, which then fail
    deep inside (or silently run with nonsense). Each numeric option uses rad2_core.cli_args, and
    each of those refuses a non-finite value."""
    bare, accepts_nan, checked = [], [], 0
    for name, module in verbs():
        for action in _verb_parser(module, monkeypatch)._actions:
            if action.type in (int, float):
                bare.append(f"rad2 {name} {action.option_strings}")
            elif getattr(action.type, "__module__", "") == "rad2_core.cli_args":
                checked += 1
                try:
                    action.type("nan")
                    accepts_nan.append(f"rad2 {name} {action.option_strings}")
                except argparse.ArgumentTypeError:
                    pass
    assert not bare, bare
    assert not accepts_nan, accepts_nan
    assert checked > 80  # the verbs' numeric options, all of them seen


def test_help_lists_every_group_and_verb_without_importing_the_stack():
    """rad2 --help and rad2 <group> --help name every group and verb with its line, and import neither
    numpy, torch nor rclpy nor a verb module: they stay fast."""
    code = ("import sys\n"
            "from rad2_bringup.cli import main\n"
            "codes = [main(['--help'])] + [main([g, '--help']) for g in sys.argv[1:]]\n"
            "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'rclpy', 'numpy')\n"
            "               or m.startswith('rad2_bringup.cli.'))\n"
            "print('HEAVY', heavy, 'CODES', codes)\n")
    groups = [g for g, (_, table) in COMMANDS.items() if "" not in table]
    res = subprocess.run([sys.executable, "-c", code, *groups], capture_output=True, text=True, timeout=60,
                         cwd="/")
    assert res.returncode == 0, res.stderr
    assert f"HEAVY [] CODES {[0] * (1 + len(groups))}" in res.stdout, res.stdout
    top = res.stdout.split("usage: rad2 data")[0]
    for group, (line, table) in COMMANDS.items():
        assert re.search(rf"^  {group} +{re.escape(line)}$", top, re.M), group
        for verb, (_, text) in table.items():
            if verb:
                assert verb in top and f"  {verb}" in res.stdout and text in res.stdout, verb


def test_every_verb_module_is_a_command():
    """A verb module the table does not name would be unreachable: every cli/<group>_<verb>.py is in it."""
    cli = ROOT / "ros2_ws" / "src" / "rad2_bringup" / "rad2_bringup" / "cli"
    modules = {p.stem for p in cli.glob("*.py")} - {"__init__", "__main__", "common"}
    assert modules == {module for _, module in verbs()}


@pytest.mark.parametrize("name,module", verbs())
def test_every_verb_answers_help_with_its_program_name_and_an_example(name, module, capsys):
    with pytest.raises(SystemExit) as done:
        main([*name.split(), "--help"])
    out = capsys.readouterr().out
    assert done.value.code == 0
    assert out.startswith(f"usage: rad2 {name} "), out[:200]
    # the description ends with its examples, each a rad2 command line
    assert "\nexample" in out, out
    examples = out.split("\nexample", 1)[1]
    assert f"rad2 {name}" in examples, examples


@pytest.mark.parametrize("argv,named", [
    (["evaluate"], "'evaluate'"),
    (["eval", "polcy"], "'polcy'"),  # with the choices and the likely one
    (["eval"], "a verb is required"),
    ([], "a group is required"),
    (["bench", "planner", "--cycles", "0"], "--cycles"),
    (["data", "merge", "--out", "x"], "inputs"),
    (["eval", "policy", "--split", "nowhere_split"], "nowhere_split"),
    (["eval", "policy", "--no-such-option"], "--no-such-option"),
])
def test_a_bad_group_verb_or_option_is_named(argv, named, tmp_path):
    res = subprocess.run([*RAD2, *argv], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert res.returncode == 2 and named in res.stderr and "Traceback" not in res.stderr, res.stderr
    if argv[:2] == ["eval", "polcy"]:
        assert "did you mean 'policy'" in res.stderr and "latency-report" in res.stderr
    if argv == ["evaluate"]:
        assert all(g in res.stderr for g in COMMANDS)


def test_the_installed_script_runs_the_same_command(tmp_path):
    """The console script of the colcon build (install/rad2_bringup/bin/rad2) is this dispatcher."""
    script = ROOT / "ros2_ws" / "install" / "rad2_bringup" / "bin" / "rad2"
    if not script.is_file():
        if os.environ.get("CI"):
            pytest.fail(f"{script} is missing: the colcon build did not install the rad2 command")
        pytest.skip(f"{script} is not built (bash tools/bootstrap.sh)")
    res = subprocess.run([str(script), "eval", "policy", "--help"], capture_output=True, text=True,
                         timeout=120, cwd=tmp_path)
    assert res.returncode == 0 and res.stdout.startswith("usage: rad2 eval policy"), res.stderr
