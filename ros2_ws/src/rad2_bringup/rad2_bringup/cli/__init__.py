"""The ``rad2`` command: one entry point for the work around the planner, in verb groups.

    rad2 demo                        the closed-loop demo (sim + planner + controller as ROS 2 processes)
    rad2 data convert|corpus|...     clip datasets: convert, generate SUMO scenarios, curate, render, bags
    rad2 train il|rl|critic|...      training: imitation, closed-loop RL, critic, self-correction, composition
    rad2 eval policy|experiments|... closed-loop and replay evaluation, latency reports, runtime consistency
    rad2 bench planner|graph|...     benchmarks
    rad2 graph up|smoke|soak|record  ROS 2 graphs: bring-up, DDS smoke check, fault soak, bag recorder
    rad2 export onnx                 ONNX export of a checkpoint

The table below is the whole command: each verb is the module ``rad2_bringup.cli.<module>`` with
``main(argv) -> int``, imported only when it runs, so ``rad2 --help`` and ``rad2 <group> --help`` stay fast
(nothing heavier than the standard library is imported for them). ``rad2 <group> <verb> --help`` is the
verb's own argparse help, ending with examples.
"""

from __future__ import annotations

import difflib
import importlib
import sys

# group -> (one line, {verb: (module, one line)}); a group of None is a verb of its own (rad2 demo).
COMMANDS: dict[str, tuple[str, dict[str, tuple[str, str]] | None]] = {
    "demo": ("the closed-loop demo: sim, planner and controller as ROS 2 processes on bundled clips",
             {"": ("demo", "")}),
    "data": ("clip datasets: convert logs, generate and curate scenarios, render, merge, bags", {
        "convert": ("data_convert", "convert driving logs (AV2, CommonRoad, WOMD, INTERACTION, rad2 "
                                    "clips) into a rad2 clip dataset"),
        "corpus": ("data_corpus", "a real-traffic corpus (NGSIM) with every qualifying vehicle as the ego, "
                                  "as train / val / test datasets"),
        "generate": ("data_generate", "generate SUMO clips with injected safety events or efficiency cases"),
        "curate": ("data_curate", "curate the RL training sets (elevated collision risk, poor progress)"),
        "render": ("data_render", "render a clip or a log to PNG (one frame) and/or GIF"),
        "headway": ("data_headway", "time gaps, closing speeds and braking logged drivers keep behind the "
                                    "vehicle ahead"),
        "merge": ("data_merge", "merge clip datasets into a new one (clip ids must be unique)"),
        "mirror": ("data_mirror", "mirror a clip dataset left-right (right-hand traffic as left-hand)"),
        "to-bag": ("data_to_bag", "write a clip as a rosbag2 MCAP bag of perception inputs"),
        "to-commonroad": ("data_to_commonroad", "write clips as CommonRoad scenarios with planning problems"),
        "repair-bag": ("data_repair_bag", "make the MCAP bag of a killed recorder readable again"),
    }),
    "train": ("training: imitation, closed-loop RL, collision critic, self-correction, composition", {
        "il": ("train_il", "imitation pretraining of the generator (or open-loop metrics of a checkpoint)"),
        "rl": ("train_rl", "closed-loop RL in the BEV-Warp simulator (TC-GRPO discriminator, OGO generator)"),
        "critic": ("train_critic", "train the safety layer's collision critic on simulator labels"),
        "self-correction": ("train_self_correction", "imitation with correction: the self-correcting "
                                                     "generator"),
        "self-correction-rl": ("train_self_correction_rl", "closed-loop fine-tuning of the self-correcting "
                                                           "generator"),
        "compose": ("train_compose", "one checkpoint from the generator of one and the discriminator of "
                                     "another"),
    }),
    "eval": ("evaluation: closed loop, experiments, safety layer, bag replay, latency, runtime consistency", {
        "policy": ("eval_policy", "closed-loop metrics of policies on dataset splits (tables, JSON, GIFs)"),
        "experiments": ("eval_experiments", "planner configurations (arms) over evaluation seeds, one table"),
        "commonroad": ("eval_commonroad", "CommonRoad planning problems closed loop, judged by the official "
                                          "solution checker"),
        "safety-layer": ("eval_safety_layer", "RAD-2 without and with each safety layer, closed loop"),
        "replay": ("eval_replay", "replay a bag of perception inputs through the real nodes, open-loop "
                                  "metrics"),
        "latency-report": ("eval_latency_report", "planning-cycle latency per stage from a bag or a live "
                                                  "graph"),
        "consistency": ("eval_consistency", "TensorRT engines against ONNX Runtime on recorded inputs"),
    }),
    "bench": ("benchmarks", {
        "planner": ("bench_planner", "latency of one planning cycle per stage (encode, denoise, score, "
                                     "select)"),
        "graph": ("bench_graph", "planner node in a ROS 2 graph: input -> trajectory latency over DDS"),
        "rollouts": ("bench_rollouts", "closed-loop rollout collection throughput (this process, Ray "
                                       "workers)"),
        "ilqr": ("bench_ilqr", "batched iLQR tracker against CasADi + IPOPT"),
        "bev": ("bench_bev", "BEV rasterisation and tokenisation per frame"),
        "sim": ("bench_sim", "BEV-Warp simulator: warp per frame, environment steps per second"),
        "all": ("bench_all", "every benchmark, one Markdown table"),
    }),
    "graph": ("ROS 2 graphs of launch/graphs.yaml", {
        "up": ("graph_up", "bring up a graph as processes (or composed in one) without ros2 launch"),
        "smoke": ("graph_smoke", "every rad2_msgs type round-trips between two processes over DDS"),
        "soak": ("graph_soak", "soak the simulation graph's safety layer under a CPU hog"),
        "record": ("graph_record", "record topics of a live graph into a rosbag2 MCAP bag"),
    }),
    "export": ("exports of a planner checkpoint", {
        "onnx": ("export_onnx", "ONNX graphs of a checkpoint, checked against PyTorch"),
    }),
}

PROG = "rad2"
HELP = ("-h", "--help")


def verbs() -> list[tuple[str, str]]:
    """Every command as (``"group verb"`` or ``"demo"``, module name)."""
    out = []
    for group, (_, table) in COMMANDS.items():
        for verb, (module, _) in table.items():
            out.append((f"{group} {verb}".strip(), module))
    return out


def _top_help() -> str:
    width = max(len(g) for g in COMMANDS)
    lines = [f"usage: {PROG} <group> <verb> [options]",
             f"       {PROG} <group> --help          the verbs of a group",
             f"       {PROG} <group> <verb> --help   the options of a verb, with examples", "",
             "rad2: the RAD-2 planning stack's data, training, evaluation, benchmarks and ROS 2 graphs.", ""]
    for group, (text, table) in COMMANDS.items():
        lines.append(f"  {group:<{width}}  {text}")
        named = [v for v in table if v]
        if named:
            lines.append(f"  {'':<{width}}    {' | '.join(named)}")
    lines += ["", "example:", f"  {PROG} eval policy --policy idm --split data/eval_safety --max-clips 4"]
    return "\n".join(lines)


def _group_help(group: str) -> str:
    text, table = COMMANDS[group]
    width = max(len(v) for v in table)
    lines = [f"usage: {PROG} {group} <verb> [options]",
             f"       {PROG} {group} <verb> --help   the options of a verb, with examples", "",
             f"{group}: {text}", ""]
    lines += [f"  {verb:<{width}}  {line}" for verb, (_, line) in table.items()]
    first = next(iter(table))
    lines += ["", "example:", f"  {PROG} {group} {first} --help"]
    return "\n".join(lines)


def _unknown(what: str, name: str, choices: list[str], usage: str) -> int:
    near = difflib.get_close_matches(name, choices, n=1)
    hint = f"; did you mean {near[0]!r}?" if near else ""
    print(f"{usage}\n{PROG}: error: unknown {what} {name!r} (choose from {', '.join(choices)}){hint}",
          file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    """Run ``rad2 argv``; returns the exit status (2 for a bad group, verb or option, as argparse)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in HELP:
        print(_top_help(), file=sys.stdout if argv else sys.stderr)
        if not argv:
            print(f"{PROG}: error: a group is required (choose from {', '.join(COMMANDS)})", file=sys.stderr)
        return 0 if argv else 2
    group, rest = argv[0], argv[1:]
    if group not in COMMANDS:
        return _unknown("group", group, list(COMMANDS), f"usage: {PROG} <group> <verb> [options]")
    table = COMMANDS[group][1]
    if "" in table:  # a verb of its own: the rest are its options
        verb, name = "", group
    else:
        usage = f"usage: {PROG} {group} <verb> [options]"
        if not rest or rest[0] in HELP:
            print(_group_help(group), file=sys.stdout if rest else sys.stderr)
            if not rest:
                print(f"{PROG} {group}: error: a verb is required (choose from {', '.join(table)})",
                      file=sys.stderr)
            return 0 if rest else 2
        verb, rest = rest[0], rest[1:]
        if verb not in table:
            return _unknown(f"{group} verb", verb, list(table), usage)
        name = f"{group} {verb}"
    module = importlib.import_module(f"{__name__}.{table[verb][0]}")
    from rad2_core.cli_args import run_tool

    return run_tool(lambda: module.main(rest), f"{PROG} {name}")

