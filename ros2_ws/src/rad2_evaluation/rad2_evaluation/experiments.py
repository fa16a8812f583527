"""Experiment arms of rad2 eval experiments: each arm (IL generator with a selection rule, a checkpoint, or
a reference policy such as PDM-Closed) driven closed loop over splits and seeds
(rad2_evaluation.closed_loop.evaluate_split, in this process or on Ray workers), the mean ± std table
and the bar plot. No ROS.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

RULES = ("uniform", "medoid", "safe_medoid")
# A mixed set (e.g. eval_rich: both kinds of clip) is judged on both CR and EP, so it gets both.
# cycle_p99_ms: the arm's planning cycle timed alone at one row per call (cycle_latency), not the
# batched rollouts of the table's episodes
COLUMNS = {"safety": ("CR", "AF-CR", "Safety@1", "comfort_violation_steps", "plan_speed_change_m_s",
                      "score", "cycle_p99_ms", "wall_s_per_clip"),
           "efficiency": ("EP-Mean", "EP@1.0", "CR", "comfort_violation_steps", "plan_speed_change_m_s",
                          "score", "cycle_p99_ms", "wall_s_per_clip"),
           "other": ("CR", "AF-CR", "offroad_rate", "EP-Mean", "EP@1.0", "comfort_violation_steps",
                     "plan_speed_change_m_s", "score", "cycle_p99_ms", "wall_s_per_clip")}
PLOTTED = {"safety": ("CR",), "efficiency": ("EP-Mean",), "other": ("CR", "EP-Mean")}


@dataclass(frozen=True)
class Arm:
    label: str
    checkpoint: str
    rule: str | None  # uniform | medoid | safe_medoid | None (the checkpoint's own selection)
    m: int | None
    h_reuse: int | None
    discriminator_candidates: str | None = None  # planner.discriminator_candidates (None: planner.yaml's)
    prior_weight: float | None = None  # planner.discriminator_prior_weight (None: planner.yaml's)
    reference: str | None = None  # a reference policy (pdm_closed, idm, ...) instead of the planner
    initial_noise: str | None = None  # planner.initial_noise (None: planner.yaml's)
    rule_stages: bool = True  # False ("@R=off"): the networks alone, every rule stage after them off


def parse_arm(text: str, il_checkpoint: str, discriminator_candidates: Sequence[str],
              noise_modes: Sequence[str] = ()) -> Arm:
    """The arm ``text`` names; ``discriminator_candidates``: the values ``D=`` may take, ``noise_modes``
    those of ``N=`` (the choices of planner.discriminator_candidates and planner.initial_noise in their
    schema, read by the entry point)."""
    head, *opts = text.split("@")
    kind, _, arg = head.partition(":")
    m = h = d = p = n = None
    rules = True
    for opt in opts:
        key, _, value = opt.partition("=")
        if key == "R" and value in ("on", "off"):
            rules = value == "on"
            continue
        if key == "D" and value in discriminator_candidates:
            d = value
            continue
        if key == "N" and value in noise_modes:
            n = value
            continue
        if key == "P" and _is_weight(value):
            p = float(value)
            continue
        if key not in ("M", "H") or not value.isdigit() or int(value) < 1:
            raise ValueError(f"arm {text!r}: option {opt!r} is not M=<int >= 1>, H=<int >= 1>, "
                             f"D={'|'.join(discriminator_candidates)}, N={'|'.join(noise_modes)}, "
                             "R=on|off or P=<float in [0, 1000]>")
        m, h = (int(value), h) if key == "M" else (m, int(value))
    if kind == "il":
        if arg not in RULES:
            raise ValueError(f"arm {text!r}: il:{arg} is not one of il:{'|il:'.join(RULES)}")
        return Arm(text, il_checkpoint, arg, m, h, d, p, initial_noise=n, rule_stages=rules)
    if kind == "ckpt":
        if not (Path(arg) / "config.json").is_file():
            raise ValueError(f"arm {text!r}: {arg} is not a planner checkpoint (no config.json)")
        return Arm(text, arg, None, m, h, d, p, initial_noise=n, rule_stages=rules)
    if kind == "ref":
        names = reference_names()
        if arg not in names:
            raise ValueError(f"arm {text!r}: ref:{arg} is not one of ref:{'|ref:'.join(names)}")
        if m is not None or d is not None or p is not None or n is not None or not rules:
            raise ValueError(f"arm {text!r}: a reference policy takes only @H=<int>")
        return Arm(text, "", None, None, h, reference=arg)
    raise ValueError(f"arm {text!r}: expected il:RULE, ckpt:PATH or ref:POLICY")


def reference_names() -> list[str]:
    """The reference policies an arm may name (every registered policy but the learned planner)."""
    from bev_warp_sim.reference_policies import POLICIES

    return [name for name in POLICIES if name != "rad2"]


def _is_weight(value: str) -> bool:
    from rad2_planner.candidates import MAX_PRIOR_WEIGHT

    try:
        return 0.0 <= float(value) <= MAX_PRIOR_WEIGHT
    except ValueError:
        return False


def policy_spec(arm: Arm, threads: int | None, backend: str | None = None, device: str | None = None):
    """How to build the arm's decision maker; ``backend`` / ``device``: the planner's network runtime
    (None: params/planner.yaml's)."""
    from rad2_training.workers import PolicySpec

    if arm.reference:
        return PolicySpec(name=arm.reference, threads=threads)
    overrides = {}
    if device:
        overrides["device"] = device
    if arm.m:
        overrides["num_candidates"] = arm.m
    if arm.discriminator_candidates:
        overrides["discriminator_candidates"] = arm.discriminator_candidates
    if arm.prior_weight is not None:
        overrides["discriminator_prior_weight"] = arm.prior_weight
    if arm.initial_noise:
        overrides["initial_noise"] = arm.initial_noise
    off = not arm.rule_stages
    if arm.rule == "uniform":
        return PolicySpec(checkpoint_dir=arm.checkpoint, selection="sample", distribution="uniform",
                          planner_overrides=overrides, threads=threads, backend=backend, rule_stages_off=off)
    if arm.rule is not None:
        overrides["fallback_selection"] = arm.rule
    # a rule arm selects by its rule, never by the checkpoint's discriminator, in a Ray worker as here
    return PolicySpec(checkpoint_dir=arm.checkpoint, selection="deterministic", planner_overrides=overrides,
                      threads=threads, backend=backend, ignore_discriminator=arm.rule is not None,
                      rule_stages_off=off)


def arm_settings(arm: Arm, spec, files: dict, workers: int, max_clips: int | None) -> dict:
    """Every setting that changes an arm's episodes (what a resumed run must share; see
    rad2_evaluation.evaluate.policy_settings): the simulator's and the planner's parameters as the arm
    runs them, its weights, selection and how its network calls are batched and threaded. ``files``:
    every file of params/ as loaded (with the run's simulator overrides), by name."""
    import copy

    from rad2_core.config import merged

    from rad2_evaluation.episode_log import checkpoint_digest
    from rad2_evaluation.evaluate import PRESENTATION_KEYS

    sim_params = files["sim"]
    sim = copy.deepcopy(sim_params)
    ev = sim.get("evaluation", {})
    for key in (*PRESENTATION_KEYS, "h_reuse"):
        ev.pop(key, None)
    h_reuse = int(arm.h_reuse or sim_params["evaluation"]["h_reuse"])
    if arm.reference:  # deterministic: its own parameter file (if it has one) decides its plans
        return {"sim": sim, "reference": arm.reference, "reference_params": files.get(arm.reference),
                "h_reuse": h_reuse, "max_clips": max_clips}
    arm_params = spec.planner_params(merged(files, *files))
    planner = {block: arm_params[block] for block in files["planner"]}
    return {"sim": sim, "planner": planner, "checkpoint": arm.checkpoint,
            "checkpoint_weights": checkpoint_digest(arm.checkpoint), "selection": spec.selection,
            "distribution": spec.distribution, "ignore_discriminator": spec.ignore_discriminator,
            "backend": spec.backend or planner["planner"]["backend"],
            "h_reuse": h_reuse, "workers": int(workers),
            "threads": spec.threads, "max_clips": max_clips}


def evaluate_arm(arm: Arm, splits: list, seeds: list[int], workers: int, max_clips: int | None,
                 params: dict, threads: int | None = None, backend: str | None = None,
                 device: str | None = None, log=None, simulator=None) -> dict[str, list[dict[str, float]]]:
    """``{split: [metrics per seed]}``; each seed's metrics also hold ``clips``, one
    :func:`clip_record` per clip, and ``skipped``, the clips the simulator refused. ``params``: every
    file of params/ as loaded (with the run's simulator overrides), merged.

    ``splits``: dataset directories, or their :class:`bev_warp_sim.preflight.CheckedSplit` (then the
    refused clips were already reported and are left out; a directory with a refused clip is
    RefusedClipsError before any rollout). ``log``: an :class:`rad2_evaluation.episode_log.EpisodeLog`
    that gets each finished chunk and already holds the arm's settings; chunks it holds are not
    driven again."""
    from bev_warp_sim.clip_registry import clip_key
    from bev_warp_sim.preflight import check_splits
    from bev_warp_sim.simulator import Simulator

    from rad2_evaluation.closed_loop import evaluate_split

    sim = simulator if simulator is not None else Simulator(params)
    checked = [c if not isinstance(c, str | Path) else check_splits([c], sim, max_clips=max_clips)[0]
               for c in splits]
    spec = policy_spec(arm, threads=1 if workers > 0 else threads, backend=backend, device=device)
    pool = runner = decider = None

    def pending() -> bool:
        if log is None:
            return True
        driven = seeds[:1] if arm.reference else seeds  # see the seed loop below
        return any(clip_key(c) not in log.done(arm.label, ch.split, seed)
                   for ch in checked for seed in driven for c in ch.clips)

    if pending():  # a resumed run with every episode done loads no planner
        if workers > 0:
            from rad2_training.workers import RolloutPool

            pool = RolloutPool(spec, params, num_workers=workers)  # the workers simulate
            runner = pool.run_chunks
        else:
            decider = spec.build(params)
    out: dict[str, list[dict[str, float]]] = {}
    try:
        for ch in checked:
            out[ch.split] = []
            for i, seed in enumerate(seeds):
                if arm.reference and i:
                    # a reference policy draws no noise and the simulator none either: its episodes are
                    # the same under every seed, so the first seed's stand for the others
                    out[ch.split].append(dict(out[ch.split][0]))
                    continue
                t0 = time.perf_counter()
                ev = evaluate_split(arm.reference or "rad2", ch.split, params, h_reuse=arm.h_reuse,
                                    simulator=sim, decider=decider, runner=runner, seed=seed, progress=True,
                                    checked=ch, log=log, run=arm.label)
                # wall time of the split's rollouts per clip (the workers' in parallel); a resumed run
                # read some episodes back, which took no time, so it has no such figure ("–")
                wall = ({"wall_s_per_clip": (time.perf_counter() - t0) / len(ev.results)}
                        if ev.results and not ev.resumed else {})
                out[ch.split].append({**ev.metrics, **wall, "clips": [clip_record(r) for r in ev.results],
                                      "skipped": [r.as_dict() for r in ev.skipped]})
    finally:
        if pool is not None:
            pool.close()
    return out


class TimedDecider:
    """A decision maker whose every ``decide`` call is timed on the wall clock (milliseconds in ``ms``)."""

    def __init__(self, inner):
        self.inner = inner
        self.ms: list[float] = []

    def start_chunk(self, sim, state, rows, seeds) -> None:
        self.inner.start_chunk(sim, state, rows, seeds)

    def decide(self, sim, state, indices, observations, seeds):
        t0 = time.perf_counter()
        plans = self.inner.decide(sim, state, indices, observations, seeds)
        self.ms.append(1e3 * (time.perf_counter() - t0))
        return plans


# decisions left out of the latency figures: the first calls build sessions and caches
LATENCY_WARMUP = 5


def cycle_latency(arm: Arm, split, params: dict, cycles: int, threads: int | None = None,
                  backend: str | None = None, device: str | None = None, simulator=None) -> dict[str, float]:
    """The arm's planning cycle as a vehicle runs it: one clip at a time, one row per call (M candidates
    in one batch for the learned planner), in this process with ``threads`` network threads (None:
    params/planner.yaml's), over the clips of ``split`` (a :class:`bev_warp_sim.preflight.CheckedSplit`)
    in order until ``cycles`` decisions after :data:`LATENCY_WARMUP` were timed. Each decision is the
    decision maker's whole call: observation to plan, every stage included; the simulator's observation
    and step are not. ``{"cycle_median_ms", "cycle_p99_ms", "cycle_count"}``; empty when ``cycles`` is
    0 or the split has no clip."""
    from bev_warp_sim.rollout import RowSpec, run_chunk
    from bev_warp_sim.simulator import Simulator

    if cycles <= 0 or not split.clips:
        return {}
    sim = simulator if simulator is not None else Simulator(params)
    timed = TimedDecider(policy_spec(arm, threads=threads, backend=backend, device=device).build(params))
    for clip, position in zip(split.clips, split.positions):
        run_chunk(sim, timed, [RowSpec(clip, 0, position, 0)], seed=0, h_reuse=arm.h_reuse)
        if len(timed.ms) >= cycles + LATENCY_WARMUP:
            break
    ms = np.asarray(timed.ms[LATENCY_WARMUP:LATENCY_WARMUP + cycles] or timed.ms, np.float64)
    return {"cycle_median_ms": float(np.median(ms)), "cycle_p99_ms": float(np.percentile(ms, 99)),
            "cycle_count": int(len(ms))}


def clip_record(result) -> dict:
    """What results.json keeps of one clip's episode (bev_warp_sim.metrics.EpisodeResult): enough to
    see which clips an arm collides on and how, next to the aggregated metrics of the seed."""
    first = result.collisions[0] if result.collisions else {}
    return {"clip_id": result.clip_id, "scenario_kind": result.scenario_kind,
            "termination": result.termination, "collided": bool(result.collided),
            "at_fault": bool(result.at_fault), "offroad": bool(result.offroad),
            "rho": float(result.rho), "min_ttc": float(result.min_ttc), "end_step": int(result.end_step),
            "collision": {k: (v.item() if isinstance(v, np.generic) else v) for k, v in first.items()
                          if isinstance(v, (str, int, float, bool, np.generic))}}


def plot_experiments(results, splits, path: Path, resolve) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from rad2_evaluation.closed_loop import split_kind

    panels = [(split, metric) for split in splits for metric in PLOTTED[split_kind(split)]]
    labels = list(results)
    fig, axes = plt.subplots(1, len(panels), figsize=(max(5.0, 0.9 * len(labels) + 2) * len(panels), 4.5),
                             squeeze=False)
    for ax, (split, metric) in zip(axes[0], panels):
        vals = [[r[metric] for r in results[a][str(resolve(split))]] for a in labels]
        ax.bar(range(len(labels)), [np.mean(v) for v in vals], yerr=[np.std(v) for v in vals], capsize=4)
        ax.set_xticks(range(len(labels)), labels, rotation=25, ha="right", fontsize=8)
        ax.set(title=f"{Path(split).name}: {metric}", ylabel=metric)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def experiments_table(results: dict, splits: list[str], seeds: list[int] | str, max_clips: int | None,
                      elapsed_s: float, sim_overrides: dict | None = None) -> list[str]:
    """Markdown: per split, the arm x metric table of mean ± standard deviation over the seeds
    (``seeds``: the list, or a description where the runs were merged); ``sim_overrides`` (the
    ``--sim-set`` settings the simulator ran with) are named under the title."""
    from rad2_planner.policy import resolve_path

    from rad2_evaluation.closed_loop import split_kind

    lines = [f"# RAD-2 experiments ({time.strftime('%Y-%m-%d %H:%M')}, {elapsed_s:.0f} s)", "",
             f"Seeds {seeds}; each cell: mean ± standard deviation over the seeds"
             + (f"; first {max_clips} clips per split" if max_clips else "") + ".", ""]
    if sim_overrides:
        lines += ["Simulator settings changed from params/sim.yaml: "
                  + ", ".join(f"`{k}={v}`" for k, v in sim_overrides.items()) + ".", ""]
    for split in splits:
        cols = COLUMNS[split_kind(split)]
        lines += [f"## {Path(split).name}", "", "| arm | " + " | ".join(cols) + " |",
                  "|---|" + "---|" * len(cols)]
        for label, per_split in results.items():
            runs = per_split[str(resolve_path(split))]
            # "–" where an older results.json (merged) predates the metric
            cells = [f"{np.mean([r[c] for r in runs]):.3f} ± {np.std([r[c] for r in runs]):.3f}"
                     if all(c in r for r in runs) else "–" for c in cols]
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
        lines.append("")
    return lines


def collision_table(results: dict, splits: list[str]) -> list[str]:
    """Markdown: per split and arm, the collisions of all seeds by the ego's contact zone (front, side,
    rear: rear-ended by a log-replayed agent that does not react), with the mean progress ratio ρ of
    the colliding episodes. Empty when the results carry no per-clip records (older results.json)."""
    from rad2_planner.policy import resolve_path

    lines = []
    for split in splits:
        rows = []
        for label, per_split in results.items():
            clips = [c for r in per_split[str(resolve_path(split))] for c in r.get("clips", [])]
            if not clips:
                continue
            hits = [c for c in clips if c["collided"]]
            zones = [c["collision"].get("ego_zone", "?") for c in hits]
            rho = f"{np.mean([c['rho'] for c in hits]):.2f}" if hits else "–"
            rows.append(f"| {label} | {len(hits)} / {len(clips)} | {sum(c['at_fault'] for c in hits)} | "
                        + " | ".join(str(zones.count(z)) for z in ("front", "side", "rear")) + f" | {rho} |")
        if rows:
            lines += [f"### {Path(split).name}: collisions by the ego's contact zone (all seeds)", "",
                      "| arm | collided / episodes | at fault | ego front | ego side | ego rear "
                      "| ρ when colliding |",
                      "|---|---|---|---|---|---|---|", *rows, ""]
    return lines


def write_report(results: dict, splits: list[str], seeds: list[int] | str, out: Path, max_clips: int | None,
                 elapsed_s: float, sim_overrides: dict | None = None) -> None:
    """experiments.md and experiments.png of ``results`` into ``out``, and the table printed."""
    from rad2_planner.policy import resolve_path

    lines = (experiments_table(results, splits, seeds, max_clips, elapsed_s, sim_overrides)
             + skipped_lines(results) + collision_table(results, splits))
    (out / "experiments.md").write_text("\n".join(lines))
    plot_experiments(results, splits, out / "experiments.png", resolve_path)
    for split in splits:
        plot_seed_summary(results, str(resolve_path(split)), out / f"summary_{Path(split).name}.png")
    print("\n".join(lines))


def skipped_lines(results: dict) -> list[str]:
    """Markdown: the clips the simulator refused and the runs left out, with the reason (once each)."""
    seen = {}
    for per_split in results.values():
        for runs in per_split.values():
            for run in runs:
                for r in run.get("skipped", []):
                    seen[(r["split"], r["clip_id"])] = r["reason"]
    if not seen:
        return []
    return ([f"Skipped {len(seen)} clip(s) the simulator refused:", ""]
            + [f"- {Path(split).name}/{clip}: {reason}" for (split, clip), reason in seen.items()] + [""])


def plot_seed_summary(results: dict, split: str, path: Path) -> Path | None:
    """``summary_<split>.png``: every arm's metrics on one split, spread over the evaluation seeds
    (None when no arm ran on it)."""
    from rad2_evaluation.closed_loop import SUMMARY_METRICS, plot_summary

    values = {label: {key: [float(r[key]) for r in per_split[split] if key in r]
                      for key, _, _ in SUMMARY_METRICS}
              for label, per_split in results.items() if per_split.get(split)}
    if not values:
        return None
    n = max(len(per_split[split]) for per_split in results.values() if per_split.get(split))
    return plot_summary(values, path, f"{Path(split).name}: {n} seed(s)", "seeds")


def run_experiments(arms: list[Arm], splits: list[str], seeds: list[int], out: Path, files: dict, *,
                    sim_overrides: dict | None = None, workers: int = 0, max_clips: int | None = None,
                    threads: int | None = None, backend: str | None = None, device: str | None = None,
                    resume: bool = False, skip_bad: bool = False, progress: bool = True) -> dict:
    """Evaluate every arm (results.json rewritten after each), then write experiments.md,
    experiments.png and summary_<split>.png into ``out`` and print the table; returns the results.
    ``files``: every file of params/ as the entry point loaded it, by name, params/sim.yaml with the
    run's ``sim_overrides`` applied (``{KEY: value}``, e.g. ``{"sim.reactive_agents": true}``: the
    simulator runs with them in this process and in the Ray workers; written to
    ``out/sim_overrides.json``).

    Every clip is checked first: RefusedClipsError lists the refused ones before any rollout unless
    ``skip_bad`` (then they are left out and named in the report). Finished episodes go to
    ``out/episodes.jsonl`` chunk by chunk; ``resume`` continues a run there (SettingsMismatch naming
    a setting an arm now runs with differently)."""
    from bev_warp_sim.preflight import check_splits
    from bev_warp_sim.simulator import Simulator
    from rad2_core.config import merged
    from rad2_planner.policy import resolve_path

    from rad2_evaluation.episode_log import EpisodeLog

    sim_overrides = dict(sim_overrides or {})
    params = merged(files, *files)
    latency_cycles = int(params["evaluation"]["latency_cycles"])
    sim = Simulator(params)
    checked = check_splits([str(resolve_path(s)) for s in splits], sim, max_clips=max_clips,
                           skip_bad=skip_bad, progress=progress)
    for c in checked:
        for r in c.refused:
            print(f"skipping refused clip {r}")
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    results = {}
    with EpisodeLog(out, resume=resume) as log:
        for arm in arms:  # every arm's settings first: a mismatch stops the run before any rollout
            spec = policy_spec(arm, threads=1 if workers > 0 else threads, backend=backend, device=device)
            log.use_settings(arm.label, arm_settings(arm, spec, files, workers, max_clips))
        (out / "sim_overrides.json").write_text(json.dumps(sim_overrides, indent=1))
        for arm in arms:
            results[arm.label] = evaluate_arm(arm, checked, seeds, workers, max_clips, params,
                                              threads=threads, backend=backend, device=device, log=log,
                                              simulator=sim)
            # timed after the rollouts (the workers are idle then), on the first split's clips, once per
            # arm: every seed's and split's cell shows the same figure
            latency = cycle_latency(arm, checked[0], params, latency_cycles, threads=threads,
                                    backend=backend, device=device, simulator=sim)
            for runs in results[arm.label].values():
                for run in runs:
                    run.update(latency)
            (out / "results.json").write_text(json.dumps(results, indent=1))
    write_report(results, splits, seeds, out, max_clips, time.time() - t0, sim_overrides)
    return results


def _read_results(path: Path) -> dict[str, dict[str, list[dict]]]:
    """A run's results.json, ``{arm: {split: [metrics per seed]}}``; ValueError naming the file when it
    is not JSON or not of that shape."""
    try:
        data = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"--merge: {path} is not JSON ({exc})") from None
    ok = isinstance(data, dict) and all(
        isinstance(per_split, dict) and all(isinstance(runs, list) and all(isinstance(r, dict) for r in runs)
                                            for runs in per_split.values())
        for per_split in data.values())
    if not ok:
        raise ValueError(f"--merge: {path} is not a results.json of rad2 eval experiments "
                         "({arm: {split: [metrics per seed]}})")
    return data


def merge_results(paths: list[Path], renames: dict[str, str] | None = None) -> tuple[dict, list[str], int]:
    """One ``{arm: {split: [metrics per seed]}}`` from the results.json of several runs (e.g. one per
    seed, run side by side), splits keyed as this checkout resolves them; also the splits and the
    number of seeds. ``renames`` (old label -> new) is applied to every file before the runs are
    pooled, so runs of one planner under two labels (a run's checkpoint, then the same weights shipped
    elsewhere) become one arm. Every arm must have the same number of runs on every split: a table
    whose cells average different seed counts would mislead, so that is an error naming the arm and
    split; a label of ``renames`` that no file holds is an error too."""
    from rad2_planner.policy import resolve_path

    renames = dict(renames or {})
    seen: set[str] = set()
    merged: dict[str, dict[str, list]] = {}
    for path in paths:
        for label, per_split in _read_results(Path(path)).items():
            seen.add(label)
            arm = renames.get(label, label)
            for split, runs in per_split.items():
                key = str(resolve_path(f"data/{Path(split).name}"))
                merged.setdefault(arm, {}).setdefault(key, []).extend(runs)
    if not merged:
        raise ValueError(f"--merge: no results in {[str(p) for p in paths]}")
    unknown = sorted(set(renames) - seen)
    if unknown:
        raise ValueError(f"--rename: no arm labelled {unknown} in the merged files "
                         f"(they hold {sorted(seen)})")
    splits = sorted({s for per in merged.values() for s in per})
    counts = {(a, s): len(per.get(s, [])) for a, per in merged.items() for s in splits}
    if len(set(counts.values())) != 1:
        bad = {f"{a} on {Path(s).name}": n for (a, s), n in counts.items()}
        raise ValueError(f"--merge: arms and splits have different numbers of runs: {bad}")
    return merged, splits, next(iter(counts.values()))
