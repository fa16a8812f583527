"""Generate SUMO clips: one clip per (kind, seed), with rejection sampling, and whole datasets.

:func:`generate_clip` is deterministic in its seed: attempt ``a`` of seed ``s`` draws everything
(network, route, traffic, event parameters, SUMO's own ``--seed``) from ``SeedSequence([s, a])``.
An attempt is rejected (and the next one tried) when the scenario could not be set up, the event
did not fire, the log contains any ego-agent box overlap, or, for safety kinds, the event's actor
did not bring the ego's time-to-collision below ``safety.near_miss_ttc_s``. TTC and collisions are the
simulator's own definition (``bev_warp_sim.safety.min_ttc_of_log`` with ``params/sim.yaml``); the caller
passes that function in as ``log_safety`` (rad2 data generate does), since this package does
not depend on ``bev_warp_sim``.
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from rad2_core.clip import Clip
from rad2_core.config import resource_path
from rad2_core.storage import save_dataset

from rad2_datasets.scenarios import convert, events, networks
from rad2_datasets.scenarios import rich as rich_scenes
from rad2_datasets.scenarios.runner import ScenarioRejected, run_scenario

_NET_CACHE: dict[str, tuple[Any, networks.LaneGeometry, Any]] = {}


@dataclass
class GenerationResult:
    clip: Clip | None
    kind: str
    seed: int
    attempts: int
    rejections: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    details: list[str] = field(default_factory=list)


def generation_params(params: dict[str, dict]) -> dict[str, dict]:
    """``cfg`` (the ``scenarios`` block), ``vehicle`` (the ``vehicle`` block) and ``sim_params``
    (params/sim.yaml) of the files the entry point loaded (``params``: ``load_all()`` by name, checked
    against their schemas there, so a bad value fails before any SUMO run): the keyword arguments of
    :func:`generate_clip`."""
    return {"cfg": params["scenarios"]["scenarios"], "vehicle": params["vehicle"]["vehicle"],
            "sim_params": params["sim"]}


def resolve_cache_dir(cfg: dict, cache_dir: str | os.PathLike | None = None) -> Path:
    if cache_dir is not None:
        return Path(cache_dir)
    return resource_path(cfg["network_cache_dir"], required=False)


def _network(spec: networks.NetworkSpec, cache_dir: Path):
    path = networks.build_network(spec, cache_dir)
    key = str(path)
    if key not in _NET_CACHE:
        import sumolib

        net = sumolib.net.readNet(key, withInternal=True)
        geom = networks.read_lane_geometry(key, net=net)
        _NET_CACHE[key] = (net, geom, convert.lane_map_from_geometry(geom))
    return path, *_NET_CACHE[key]


LogSafety = Callable[[Clip, dict], dict[str, Any]]
"""``log_safety(clip, sim_params) -> {"min_ttc", "argmin_step", "collisions", ...}``: the simulator's
safety of a logged drive, i.e. ``bev_warp_sim.safety.min_ttc_of_log`` (a module-level function, so it
pickles into worker processes)."""


def check_clip(clip: Clip, kind: str, cfg: dict, sim_params: dict, log_safety: LogSafety) -> dict[str, Any]:
    """Safety figures of a logged clip; raises ScenarioRejected on a collision or a missing near-miss."""
    res = log_safety(clip, sim_params)
    if res["collisions"]:
        c = res["collisions"][0]
        raise ScenarioRejected("collision", f"ego overlaps agent {c['agent_id']} at step {c['step']}")
    out = {"min_ttc": round(float(res["min_ttc"]), 3), "min_ttc_step": int(res["argmin_step"])}
    actor_ids = clip.metadata.get("event", {}).get("actor_ids", [])
    if actor_ids:
        keep = np.isin(clip.agent_ids, np.asarray(actor_ids, dtype=np.int64))
        out["actor_min_ttc"] = round(float(log_safety(clip.select_agents(keep), sim_params)["min_ttc"]), 3)
    if kind in events.SAFETY_KINDS:
        thr = float(cfg["safety"]["near_miss_ttc_s"])
        if out.get("actor_min_ttc", float("inf")) >= thr:
            raise ScenarioRejected("no_near_miss", f"actor min TTC {out.get('actor_min_ttc')} >= {thr}")
    return out


def generate_clip(
    kind: str,
    seed: int,
    *,
    log_safety: LogSafety,
    cfg: dict,
    vehicle: dict,
    sim_params: dict,
    cache_dir: str | os.PathLike | None = None,
    network_kind: str | None = None,
    max_attempts: int | None = None,
    signals: bool = False,
    rich: bool = False,
) -> GenerationResult:
    """One clip of ``kind`` for ``seed`` (retrying with derived seeds); ``clip`` is None if all failed.
    ``log_safety``: see :data:`LogSafety`. ``rich``: a richer scene (see ``scenarios.rich``), drawn from
    a fourth random stream so that the clips without it are unchanged. ``cfg``, ``vehicle``,
    ``sim_params``: :func:`generation_params`."""
    if kind not in events.ALL_KINDS:
        raise ValueError(f"scenario kind {kind!r} is not one of {list(events.ALL_KINDS)}")
    kind_cfg = cfg["kinds"].get(kind)
    if kind_cfg is None:
        raise ValueError(f"scenarios.kinds has no entry for {kind!r}")
    nets = [network_kind] if network_kind else list(kind_cfg["networks"])
    for n in nets:
        if n not in networks.NETWORK_KINDS:
            raise ValueError(f"scenarios.kinds.{kind}.networks: {n!r} is not one of {networks.NETWORK_KINDS}")
    cache = resolve_cache_dir(cfg, cache_dir)
    attempts = int(max_attempts if max_attempts is not None else cfg["safety"]["max_attempts"])
    rejections: Counter = Counter()
    details: list[str] = []
    t0 = time.perf_counter()
    for attempt in range(attempts):
        ss = np.random.SeedSequence([int(seed), attempt])
        net_ss, ev_ss, sim_ss, rich_ss = ss.spawn(4)  # children 0-2 do not depend on the count
        net_rng = np.random.default_rng(net_ss)
        net_kind = nets[int(net_rng.integers(len(nets)))]
        run_vehicle, rich_run = vehicle, None
        if rich:
            rich_rng = np.random.default_rng(rich_ss)
            settings = rich_scenes.draw_settings(cfg["rich"], rich_rng)
            rich_run = rich_scenes.RichRun(cfg["rich"], settings, rich_rng)
            run_vehicle = {**vehicle, "length": settings.ego_length_m, "width": settings.ego_width_m}
        specs = _specs(cfg, net_kind, rich_run)
        spec = specs[int(net_rng.integers(len(specs)))]
        net_file, net, geom, lane_map = _network(spec, cache)
        event = events.make_event(kind, cfg, np.random.default_rng(ev_ss))
        sim_seed = int(sim_ss.generate_state(1)[0] % (2**31 - 1))
        try:
            raw = run_scenario(
                event, net_kind, net_file, net, sim_seed, cfg, run_vehicle, str(kind_cfg["demand"]), rich_run
            )
            if raw.sumo_collisions:
                raise ScenarioRejected("collision", "SUMO reported an ego collision")
            meta = {
                "source": "sumo",
                "scenario_kind": kind,
                "network_kind": net_kind,
                "network": spec.name,
                "seed": int(seed),
                "attempt": attempt,
                "sumo_seed": sim_seed,
                "demand": str(kind_cfg["demand"]),
            }
            if rich_run is not None:
                meta["rich"] = rich_run.settings.as_metadata()
            clip = convert.record_to_clip(
                raw, geom, lane_map, f"sumo_{kind}_{int(seed)}", meta, float(cfg["sim"]["route_extension_m"]),
                signals=signals,
            )
            clip.validate()
            clip.metadata.update(check_clip(clip, kind, cfg, sim_params, log_safety))
            clip.metadata["rejected_attempts"] = dict(rejections)
            return GenerationResult(
                clip, kind, int(seed), attempt + 1, dict(rejections), time.perf_counter() - t0, details
            )
        except ScenarioRejected as exc:
            rejections[exc.reason] += 1
            details.append(str(exc))
    return GenerationResult(
        None, kind, int(seed), attempts, dict(rejections), time.perf_counter() - t0, details
    )


def _specs(cfg: dict, net_kind: str, rich_run: rich_scenes.RichRun | None) -> list[networks.NetworkSpec]:
    """The maps of a network kind: as committed, or with the rich scene's lane width and sidewalks."""
    if rich_run is None:
        return networks.network_specs(cfg["networks"], net_kind)
    return networks.network_specs(cfg["networks"], net_kind, rich_run.settings.lane_width_m,
                                  float(cfg["rich"]["sidewalk_width_m"]))


def _all_specs(cfg: dict, net_kind: str, rich: bool) -> list[networks.NetworkSpec]:
    """Every map a run may draw for a network kind (rich: one per lane width)."""
    if not rich:
        return networks.network_specs(cfg["networks"], net_kind)
    sidewalk = float(cfg["rich"]["sidewalk_width_m"])
    return [spec for w in cfg["rich"]["lane_width_m"]
            for spec in networks.network_specs(cfg["networks"], net_kind, float(w), sidewalk)]


def _job(args) -> GenerationResult:
    kind, seed, cache_dir, log_safety, network_kind, signals, rich, params = args
    return generate_clip(kind, seed, log_safety=log_safety, **params,
                         cache_dir=cache_dir, network_kind=network_kind, signals=signals, rich=rich)


def plan_jobs(kinds: list[str], count: int, seed: int) -> list[tuple[str, int]]:
    """Round-robin kinds; clip i gets seed ``seed + i``."""
    if count < 1:
        raise ValueError(f"count must be >= 1, got {count}")
    if not kinds:
        raise ValueError("kinds is empty")
    for k in kinds:
        if k not in events.ALL_KINDS:
            raise ValueError(f"kind {k!r} is not one of {list(events.ALL_KINDS)}")
    return [(kinds[i % len(kinds)], int(seed) + i) for i in range(count)]


def generate_dataset(
    out_dir: str | os.PathLike,
    kinds: list[str],
    count: int,
    seed: int,
    *,
    log_safety: LogSafety,
    params: dict[str, dict],
    workers: int = 1,
    cache_dir: str | os.PathLike | None = None,
    description: str | None = None,
    chunk: int = 25,
    progress: bool = True,
    log=print,
    append: bool = False,
    network_kind: str | None = None,
    signals: bool = False,
    rich: bool = False,
) -> dict[str, Any]:
    """Generate ``count`` clips into a dataset directory; returns a report (also written as
    ``generation_report.json`` next to ``index.json``). ``log_safety``: see :data:`LogSafety`; ``params``:
    scenarios, vehicle and sim of ``load_all()``, handed to every job (a run keeps the values its entry
    point loaded even if params/ is edited while it runs; worker processes restart every 50 clips)."""
    params = generation_params(params)
    cfg = params["cfg"]
    cache = resolve_cache_dir(cfg, cache_dir)
    jobs = plan_jobs(kinds, count, seed)
    # build every network once up front so workers never race on netgenerate
    for k in sorted(set(kinds)):
        for nk in ([network_kind] if network_kind else cfg["kinds"][k]["networks"]):
            for spec in _all_specs(cfg, nk, rich):
                networks.build_network(spec, cache)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    results: list[GenerationResult] = []
    pending: list[Clip] = []
    first_save = not append
    t_start = time.perf_counter()

    def flush():
        nonlocal first_save, pending
        if pending:
            save_dataset(pending, out, append=not first_save, description=description)
            first_save = False
            pending = []

    args = [(k, s, str(cache), log_safety, network_kind, bool(signals), bool(rich), params) for k, s in jobs]
    if workers > 1:
        import multiprocessing as mp

        pool = mp.get_context("spawn").Pool(workers, maxtasksperchild=50)
        it = pool.imap(_job, args)
    else:
        pool = None
        it = map(_job, args)
    if progress:
        from tqdm import tqdm

        it = tqdm(it, total=len(args), desc=f"generating {out.name}", unit="clip")
    try:
        for res in it:
            results.append(res)
            if res.clip is None:
                log(f"  {res.kind} seed {res.seed}: all {res.attempts} attempts rejected {res.rejections}")
                continue
            if progress and hasattr(it, "set_postfix"):
                it.set_postfix(
                    kind=res.kind, s_per_clip=f"{res.seconds:.1f}", min_ttc=res.clip.metadata.get("min_ttc")
                )
            pending.append(res.clip)
            if len(pending) >= chunk:
                flush()
        flush()
    finally:
        if pool is not None:
            pool.close()
            pool.join()
    report = summarize(results, time.perf_counter() - t_start, workers)
    report.update({"kinds": kinds, "count": count, "seed": seed})
    with (out / "generation_report.json").open("w") as f:
        json.dump(report, f, indent=1, sort_keys=True)
    return report


def summarize(results: list[GenerationResult], wall_s: float, workers: int) -> dict[str, Any]:
    per_kind: dict[str, Any] = {}
    for kind in sorted({r.kind for r in results}):
        rs = [r for r in results if r.kind == kind]
        ok = [r for r in rs if r.clip is not None]
        rej: Counter = Counter()
        for r in rs:
            rej.update(r.rejections)
        attempts = sum(r.attempts for r in rs)
        ttc = np.array([r.clip.metadata["min_ttc"] for r in ok]) if ok else np.zeros(0)
        actor_ttc = (
            np.array([r.clip.metadata.get("actor_min_ttc", np.nan) for r in ok]) if ok else np.zeros(0)
        )
        per_kind[kind] = {
            "clips": len(ok),
            "failed": len(rs) - len(ok),
            "attempts": attempts,
            "rejection_rate": round(1.0 - len(ok) / max(attempts, 1), 3),
            "rejections": dict(rej),
            "seconds_per_clip_mean": round(float(np.mean([r.seconds for r in rs])), 2),
            "min_ttc": _dist(ttc),
            "actor_min_ttc": _dist(actor_ttc[np.isfinite(actor_ttc)]),
            "networks": dict(Counter(r.clip.metadata["network_kind"] for r in ok)),
        }
    n_ok = sum(1 for r in results if r.clip is not None)
    return {
        "clips": n_ok,
        "wall_s": round(wall_s, 1),
        "workers": workers,
        "wall_s_per_clip": round(wall_s / max(n_ok, 1), 2),
        "per_kind": per_kind,
    }


def _dist(a: np.ndarray) -> dict[str, float]:
    if len(a) == 0:
        return {}
    q = np.percentile(a, [0, 25, 50, 75, 100])
    return {
        "min": round(float(q[0]), 2),
        "p25": round(float(q[1]), 2),
        "median": round(float(q[2]), 2),
        "p75": round(float(q[3]), 2),
        "max": round(float(q[4]), 2),
        "mean": round(float(np.mean(a)), 2),
    }


# --------------------------------------------------------------------------------------------------
# CLI support (rad2 data generate)
# --------------------------------------------------------------------------------------------------


def print_report(name: str, report: dict) -> None:
    """One line for the dataset, one per scenario kind (clips, failures, rejections, min TTC)."""
    print(
        f"[{name}] {report['clips']} clips in {report['wall_s']} s "
        f"({report['wall_s_per_clip']} s/clip wall, {report['workers']} worker(s))"
    )
    for kind, r in report["per_kind"].items():
        ttc = r["actor_min_ttc"] or r["min_ttc"]
        print(
            f"  {kind:18s} clips {r['clips']:4d}  failed {r['failed']:3d}"
            f"  rejection rate {r['rejection_rate']:.2f}"
            f"  {r['seconds_per_clip_mean']:.2f} s/clip  min TTC median {ttc.get('median', '-')}"
            f"  rejections {r['rejections']}"
        )


def clean_dataset_dir(directory: Path) -> None:
    """Remove a dataset's clips/, maps/, index.json and generation_report.json (nothing else)."""
    for sub in ("clips", "maps"):
        if (directory / sub).is_dir():
            import shutil

            shutil.rmtree(directory / sub)
    for f in ("index.json", "generation_report.json"):
        if (directory / f).exists():
            (directory / f).unlink()


def generate_bundled(data_dir: Path, log_safety: LogSafety, *, params: dict[str, dict],
                     seed: int | None = None, workers: int = 1,
                     cache_dir: str | os.PathLike | None = None) -> None:
    """Regenerate the committed sets under ``data_dir`` from presets.bundled of params/scenarios.yaml
    (``seed`` overrides its base seed; ``params`` as for :func:`generate_dataset`), printing a report
    per set."""
    bundle = params["scenarios"]["scenarios"]["presets"]["bundled"]
    base = int(seed if seed is not None else bundle["seed"])
    for name, spec in bundle["sets"].items():
        out = Path(data_dir) / name
        clean_dataset_dir(out)
        t0 = time.perf_counter()
        rep = generate_dataset(
            out,
            list(spec["kinds"]),
            int(spec["count"]),
            base + int(spec["seed_offset"]),
            log_safety=log_safety,
            params=params,
            workers=workers,
            cache_dir=cache_dir,
            description=f"SUMO {name}: rad2 data generate --bundled (seed {base})",
        )
        print_report(name, rep)
        print(f"  wrote {out} in {time.perf_counter() - t0:.1f} s")
