"""A real-traffic corpus converted with every qualifying vehicle as the ego, split by scenario file (no ROS).

The NGSIM corpus (``/work/shared/data/ngsim`` or any copy of it: ``US101/*.xml`` and
``Lankershim/*.xml``, CommonRoad scenarios recorded without an ego) holds every vehicle of a scene at
10 Hz. :func:`convert_corpus` promotes each qualifying vehicle to ego once and writes one clip dataset
per split (``<out>/train``, ``<out>/val``, ``<out>/test``: ``index.json``, ``clips/``, ``maps/``).

Qualifying (:class:`EgoCriteria`, params/bev.yaml ``adapters.corpus_ego`` and ``adapters.promoted_ego``):
a vehicle of a listed CommonRoad type (``CAR``) and of passenger-car size (NGSIM labels trucks and
buses ``CAR`` too; their boxes give them away), logged without gaps for at least ``min_duration_s``,
moving at ``min_mean_speed_m_s`` on average, every logged position on the lanelets (within
``sim.offroad_margin_m``, the simulator's off-road rule), and whose logged box overlaps no other road
user's (NGSIM queues have such boxes: replayed as the ego, the log itself collides). A qualifying ego is
*refused* when its clip fails what the simulator checks: the route (:func:`rad2_core.route_path.check_route`,
the reason counted as ``route <reason>``), the plausibility of the log (``implausible``), the clip's
consistency (``invalid``).

Egos of one scene share its traffic, so the splits are by scenario file, fixed and committed
(``data/splits/<corpus>_{train,val,test}.txt``, one path relative to the corpus root per line), made
once by :func:`make_splits` (a seeded shuffle per road, so every split holds both roads).
"""

from __future__ import annotations

import json
import math
import os
import time
import zlib
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from rad2_core.clip import Clip
from rad2_core.config import require
from rad2_core.field_checks import ClipValidationError
from rad2_core.route_path import RouteError

SPLITS = ("train", "val", "test")
# corpus name -> the road folders under its root (each road is in every split)
CORPORA = {"ngsim": ("US101", "Lankershim")}
# the seeded shuffle that made data/splits/ngsim_*.txt (make_splits)
SPLIT_SEED = 20260101
TEST_FRACTION = 0.25
VAL_FRACTION = 0.1


class CorpusError(ValueError):
    """A corpus or split list that cannot be used (names the file, the entry and what is wrong)."""


@dataclass(frozen=True)
class EgoCriteria:
    """Which logged vehicles qualify as ego (see the module docstring)."""

    types: tuple[str, ...]
    length_m: tuple[float, float]
    width_m: tuple[float, float]
    min_duration_s: float
    min_mean_speed_m_s: float
    offroad_margin_m: float

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> EgoCriteria:
        """From params/bev.yaml (``adapters.corpus_ego``, ``adapters.promoted_ego``) and params/sim.yaml
        (``sim.offroad_margin_m``) as loaded, merged (:func:`rad2_core.config.merged`)."""
        corpus = require(params, "adapters.corpus_ego")
        size = require(params, "adapters.promoted_ego")
        return cls(types=tuple(str(t) for t in corpus["types"]),
                   length_m=tuple(float(v) for v in size["length_m"]),
                   width_m=tuple(float(v) for v in size["width_m"]),
                   min_duration_s=float(corpus["min_duration_s"]),
                   min_mean_speed_m_s=float(corpus["min_mean_speed_m_s"]),
                   offroad_margin_m=float(require(params, "sim.offroad_margin_m")))


# ------------------------------------------------------------------------------------------------------
# scenario files and splits
# ------------------------------------------------------------------------------------------------------
def _roads(corpus: str) -> tuple[str, ...]:
    if corpus not in CORPORA:
        raise CorpusError(f"corpus: unknown {corpus!r}; known: {sorted(CORPORA)}")
    return CORPORA[corpus]


def corpus_scenarios(root: str | os.PathLike, corpus: str = "ngsim") -> list[str]:
    """Every scenario file of the corpus, as paths relative to ``root`` (``US101/USA_US101-1_1_T-1.xml``),
    road by road in name order. Raises :class:`CorpusError` when a road folder is missing or empty."""
    root = Path(root)
    out = []
    for road in _roads(corpus):
        files = sorted(p.name for p in (root / road).glob("*.xml"))
        if not files:
            raise CorpusError(f"{root / road}: no CommonRoad *.xml scenarios (corpus {corpus!r} expects "
                              f"the folders {list(_roads(corpus))} under {root})")
        out += [f"{road}/{name}" for name in files]
    return out


def road_of(scenario: str) -> str:
    return scenario.split("/", 1)[0]


def _logged_states(obstacle) -> set[tuple[int, float, float]]:
    """(obstacle id, x, y to 0.1 m) of every logged state: the same vehicle logged at the same place."""
    from rad2_datasets.adapters.commonroad import obstacle_states

    return {(int(obstacle.obstacle_id), round(float(st.position[0]), 1), round(float(st.position[1]), 1))
            for st in obstacle_states(obstacle).values()}


def scenario_groups(root: str | os.PathLike, scenarios: list[str], progress: bool = False) -> list[list[str]]:
    """The scenario files of one road that share traffic, as groups (each sorted, groups in order of
    their first file): two files are in one group when they log the same vehicle at the same place
    (connected through any chain of such files). The NGSIM release holds the same recording several
    times (``USA_US101-10_1``, ``-10_3``, ``-10_4``; ``USA_Lanker-2_10`` and ``-2_22``) and windows
    that share vehicles at their ends, so splitting by file alone would put one driver in two splits."""
    from tqdm import tqdm

    from rad2_datasets.adapters.commonroad import read_commonroad_file

    root = Path(root)
    owner: dict[tuple[int, float, float], dict[str, str]] = {}
    parent = {name: name for name in scenarios}

    def find(x: str) -> str:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for name in tqdm(sorted(scenarios), desc="grouping scenarios", unit="scenario", disable=not progress):
        scenario, _ = read_commonroad_file(root / name)
        road = road_of(name)
        for obstacle in scenario.dynamic_obstacles:
            for key in _logged_states(obstacle):
                first = owner.setdefault(key, {}).setdefault(road, name)
                if first != name:
                    parent[find(name)] = find(first)
    groups: dict[str, list[str]] = {}
    for name in sorted(scenarios):
        groups.setdefault(find(name), []).append(name)
    return sorted(groups.values(), key=lambda g: g[0])


def make_splits(scenarios: list[str], groups: list[list[str]] | None = None, seed: int = SPLIT_SEED,
                test_fraction: float = TEST_FRACTION, val_fraction: float = VAL_FRACTION
                ) -> dict[str, list[str]]:
    """Train / validation / test lists of scenario files that keep each group of files sharing traffic
    (:func:`scenario_groups`; None: every file alone) in one split: per road the groups in a shuffle
    seeded by ``seed`` and the road's name go to test until it holds ceil(test_fraction x n) of the
    road's n files, then to validation until ceil(val_fraction x n), the rest to training (so each road
    is in every split and test holds at least ``test_fraction`` of the scenario files). Each list is
    sorted."""
    if not 0.0 < test_fraction < 1.0 or not 0.0 < val_fraction < 1.0 or test_fraction + val_fraction >= 1.0:
        raise CorpusError(f"test_fraction {test_fraction}, val_fraction {val_fraction}: each must be in "
                          "(0, 1) and their sum below 1")
    scenarios = sorted(set(scenarios))
    groups = [[s] for s in scenarios] if groups is None else [sorted(g) for g in groups]
    grouped = sorted(s for g in groups for s in g)
    if grouped != scenarios:
        raise CorpusError("groups: must hold every scenario file exactly once")
    by_road: dict[str, list[list[str]]] = {}
    for g in groups:
        roads = {road_of(s) for s in g}
        if len(roads) != 1:
            raise CorpusError(f"groups: {g[:3]} mixes roads {sorted(roads)}")
        by_road.setdefault(road_of(g[0]), []).append(g)
    out: dict[str, list[str]] = {split: [] for split in SPLITS}
    for road, road_groups in sorted(by_road.items()):
        n = sum(len(g) for g in road_groups)
        if len(road_groups) < 3:
            raise CorpusError(f"road {road!r} has {len(road_groups)} groups of scenarios; every split needs "
                              "one")
        rng = np.random.default_rng([seed, zlib.crc32(road.encode())])
        order = [road_groups[i] for i in rng.permutation(len(road_groups))]
        quota = {"test": math.ceil(test_fraction * n), "val": math.ceil(val_fraction * n)}
        taken = {"test": [], "val": [], "train": []}
        for g in order:
            split = next((k for k in ("test", "val") if len(taken[k]) < quota[k]), "train")
            taken[split] += g
        if not taken["train"]:
            raise CorpusError(f"road {road!r}: {n} scenarios leave none for training")
        for split in SPLITS:
            out[split] += taken[split]
    return {split: sorted(files) for split, files in out.items()}


def split_path(directory: str | os.PathLike, corpus: str, split: str) -> Path:
    return Path(directory) / f"{corpus}_{split}.txt"


def write_splits(splits: dict[str, list[str]], directory: str | os.PathLike, corpus: str = "ngsim"
                 ) -> list[Path]:
    """Write ``<directory>/<corpus>_<split>.txt`` (one scenario path a line, sorted)."""
    Path(directory).mkdir(parents=True, exist_ok=True)
    paths = []
    for split in SPLITS:
        path = split_path(directory, corpus, split)
        path.write_text("".join(f"{s}\n" for s in sorted(splits[split])))
        paths.append(path)
    return paths


def read_splits(directory: str | os.PathLike, corpus: str = "ngsim",
                scenarios: list[str] | None = None) -> dict[str, list[str]]:
    """The committed split lists; :class:`CorpusError` naming the file and the entry when a list is
    missing, names a road the corpus does not have, or repeats a scenario (within or across lists), and,
    given the corpus' ``scenarios``, when an entry is not one of them or a scenario is in no list."""
    roads = _roads(corpus)
    out: dict[str, list[str]] = {}
    where: dict[str, Path] = {}
    for split in SPLITS:
        path = split_path(directory, corpus, split)
        if not path.is_file():
            raise CorpusError(f"{path}: no such split list (make one with make_splits / --make-splits)")
        out[split] = []
        for n, line in enumerate(path.read_text().splitlines(), 1):
            entry = line.strip()
            if not entry or entry.startswith("#"):
                continue
            if road_of(entry) not in roads or "/" not in entry:
                raise CorpusError(f"{path}:{n}: {entry!r} is not <road>/<file>.xml with a road of "
                                  f"{list(roads)}")
            if entry in where:
                raise CorpusError(f"{path}:{n}: {entry!r} is already listed in {where[entry]}")
            where[entry] = path
            out[split].append(entry)
    if scenarios is not None:
        known = set(scenarios)
        for entry, path in where.items():
            if entry not in known:
                raise CorpusError(f"{path}: lists {entry!r}, which is not a scenario of the corpus")
        missing = sorted(known - set(where))
        if missing:
            raise CorpusError(f"{Path(directory)}: {len(missing)} scenarios of the corpus are in no split "
                              f"list (first: {missing[0]!r})")
    return out


# ------------------------------------------------------------------------------------------------------
# egos of one scenario
# ------------------------------------------------------------------------------------------------------
@dataclass
class EgoOutcome:
    """What became of one logged vehicle: ``clip`` when converted; else ``status`` is ``not qualifying``
    or ``refused`` and ``reason`` a short key (``message`` the details)."""

    scenario: str
    obstacle_id: int
    status: str  # converted | not qualifying | duplicate | refused
    reason: str = ""
    message: str = ""
    clip: Clip | None = None
    same_as: str = ""  # a duplicate: the scenario file that logged the vehicle identically first


def _drivable_area(lane_map, margin: float):
    import shapely
    from shapely.geometry import Polygon

    polys = [Polygon(p).buffer(0) for p in lane_map.drivable_areas if len(p) >= 3]
    area = shapely.unary_union(polys).buffer(margin)
    shapely.prepare(area)
    return area


def _not_qualifying(obstacle, dt: float, area, criteria: EgoCriteria) -> tuple[str, str] | None:
    """(reason, message) when the vehicle does not qualify as ego, else None (the overlap with another
    road user is checked separately: it is the expensive test)."""
    import shapely

    from rad2_datasets.adapters.commonroad import box_size, obstacle_states

    kind = obstacle.obstacle_type.name
    if kind not in criteria.types:
        return "type", f"type {kind} not in {list(criteria.types)}"
    length, width = box_size(obstacle.obstacle_shape)
    if not (criteria.length_m[0] <= length <= criteria.length_m[1]
            and criteria.width_m[0] <= width <= criteria.width_m[1]):
        return "size", f"box {length:.1f} x {width:.1f} m is not of passenger-car size"
    states = obstacle_states(obstacle)
    steps = sorted(states)
    if steps != list(range(steps[0], steps[-1] + 1)):
        return "gaps", "its time steps have gaps"
    duration = (len(steps) - 1) * dt
    if duration < criteria.min_duration_s - 1e-9:
        return "short", f"logged {duration:.1f} s < {criteria.min_duration_s:g} s"
    speed = float(np.mean([float(getattr(states[k], "velocity", 0.0) or 0.0) for k in steps]))
    if speed < criteria.min_mean_speed_m_s:
        return "standing", f"mean speed {speed:.2f} m/s < {criteria.min_mean_speed_m_s:g} m/s"
    xy = np.array([states[k].position for k in steps], np.float64)
    off = np.flatnonzero(~shapely.contains_xy(area, xy[:, 0], xy[:, 1]))
    if len(off):
        t = int(off[0])
        return "off_map", (f"logged position at time step {steps[t]} ({xy[t, 0]:.1f}, {xy[t, 1]:.1f}) is off "
                           "the lanelets")
    return None


def scenario_egos(path: str | os.PathLike, params: dict[str, Any], criteria: EgoCriteria,
                  scenario_name: str | None = None, metadata: dict[str, Any] | None = None,
                  seen: dict[tuple, str] | None = None) -> Iterator[EgoOutcome]:
    """One :class:`EgoOutcome` per dynamic obstacle of the CommonRoad file ``path`` (in id order), the
    qualifying ones converted into clips (``metadata`` added to each clip's; ``params`` as for
    :func:`convert_corpus`). ``seen``: the qualifying vehicles met before (their logged track -> the
    scenario file), updated here; a vehicle logged identically in an earlier file (the corpus repeats
    recordings) is a ``duplicate`` and not converted again. A file that does not open raises
    :class:`rad2_datasets.adapters.commonroad.CommonRoadAdapterError` naming it."""
    from rad2_datasets.adapters.commonroad import (
        CommonRoadAdapterError,
        lanelet_map,
        logged_overlap,
        read_commonroad_file,
        scenario_clip,
    )
    from rad2_datasets.adapters.logs import LogFormatError, plausible_clip

    name = scenario_name or Path(path).name
    scenario, planning = read_commonroad_file(path)
    lane_map = lanelet_map(scenario, params)
    area = _drivable_area(lane_map, criteria.offroad_margin_m)
    for obstacle in sorted(scenario.dynamic_obstacles, key=lambda o: o.obstacle_id):
        oid = int(obstacle.obstacle_id)
        why = _not_qualifying(obstacle, float(scenario.dt), area, criteria)
        if why is None:
            overlap = logged_overlap(scenario, obstacle)
            why = None if overlap is None else ("logged_overlap", overlap)
        if why is not None:
            yield EgoOutcome(name, oid, "not qualifying", *why)
            continue
        if seen is not None:
            track = (road_of(name), frozenset(_logged_states(obstacle)))
            if track in seen:
                yield EgoOutcome(name, oid, "duplicate", "duplicate", f"logged identically in {seen[track]}",
                                 same_as=seen[track])
                continue
            seen[track] = name
        try:
            clip = scenario_clip(scenario, planning, oid, params, lane_map)
            clip = plausible_clip(clip, f"{name}: ego {oid}", params)
        except RouteError as exc:
            yield EgoOutcome(name, oid, "refused", f"route {exc.reason}", str(exc))
            continue
        except LogFormatError as exc:
            yield EgoOutcome(name, oid, "refused", "implausible", str(exc))
            continue
        except (ClipValidationError, CommonRoadAdapterError) as exc:
            yield EgoOutcome(name, oid, "refused", "invalid", str(exc))
            continue
        if metadata:
            from dataclasses import replace

            clip = replace(clip, metadata={**clip.metadata, **metadata})
        yield EgoOutcome(name, oid, "converted", clip=clip)


# ------------------------------------------------------------------------------------------------------
# the whole corpus
# ------------------------------------------------------------------------------------------------------
def _clear_dataset(directory: Path) -> None:
    """Remove the files of a dataset written before into ``directory`` (its index, clips and maps), so
    that a conversion run again leaves no clip of the earlier run behind; anything else is kept."""
    if not (directory / "index.json").is_file():
        return
    for pattern in ("clips/*.npz", "maps/*.npz", "index.json", "clips.txt"):
        for f in directory.glob(pattern):
            f.unlink()


@dataclass
class CorpusReport:
    """Counts of one conversion (``as_dict`` is what ``corpus_report.json`` holds)."""

    corpus: str
    vehicles: int = 0
    not_qualifying: Counter = field(default_factory=Counter)
    duplicates: int = 0
    qualifying: int = 0
    converted: int = 0
    refused: Counter = field(default_factory=Counter)
    refusal_examples: dict[str, list[str]] = field(default_factory=dict)
    scenarios: dict[str, int] = field(default_factory=dict)
    clips: dict[str, int] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    clips_by_road: dict[str, dict[str, int]] = field(default_factory=dict)
    unreadable: list[str] = field(default_factory=list)
    wall_s: float = 0.0

    @property
    def acceptance(self) -> float:
        return self.converted / self.qualifying if self.qualifying else 0.0

    def add(self, split: str, road: str, outcome: EgoOutcome) -> None:
        self.vehicles += 1
        if outcome.status == "not qualifying":
            self.not_qualifying[outcome.reason] += 1
            return
        if outcome.status == "duplicate":
            self.duplicates += 1
            return
        self.qualifying += 1
        if outcome.status == "refused":
            self.refused[outcome.reason] += 1
            examples = self.refusal_examples.setdefault(outcome.reason, [])
            if len(examples) < 5:
                examples.append(f"{outcome.scenario}: ego {outcome.obstacle_id}: {outcome.message}")
            return
        self.converted += 1
        self.clips[split] = self.clips.get(split, 0) + 1
        self.seconds[split] = self.seconds.get(split, 0.0) + float(outcome.clip.duration_s)
        by_road = self.clips_by_road.setdefault(split, {})
        by_road[road] = by_road.get(road, 0) + 1

    def as_dict(self) -> dict[str, Any]:
        return {"corpus": self.corpus, "vehicles": self.vehicles, "not_qualifying": dict(self.not_qualifying),
                "duplicates": self.duplicates,
                "qualifying": self.qualifying, "converted": self.converted, "refused": dict(self.refused),
                "acceptance": self.acceptance, "refusal_examples": self.refusal_examples,
                "scenarios": self.scenarios, "clips": self.clips, "clips_by_road": self.clips_by_road,
                "hours": {k: v / 3600.0 for k, v in self.seconds.items()},
                "unreadable": self.unreadable, "wall_s": self.wall_s}

    def lines(self) -> list[str]:
        """The report as printed by the command."""
        out = [f"{self.corpus}: {self.vehicles} vehicles, {self.qualifying} qualify as ego, {self.converted} "
               f"converted ({100.0 * self.acceptance:.2f} %), {sum(self.refused.values())} refused"]
        out.append("  not qualifying: " + (", ".join(f"{k} {v}" for k, v in self.not_qualifying.most_common())
                                          or "none"))
        out.append(f"  duplicates (logged identically in an earlier scenario file): {self.duplicates}")
        out.append("  refused: " + (", ".join(f"{k} {v}" for k, v in self.refused.most_common()) or "none"))
        for reason, examples in sorted(self.refusal_examples.items()):
            out += [f"    {reason}: {e}" for e in examples[:2]]
        for split in SPLITS:
            if split in self.scenarios:
                roads = ", ".join(f"{r} {n}" for r, n in sorted(self.clips_by_road.get(split, {}).items()))
                out.append(f"  {split}: {self.scenarios[split]} scenarios, {self.clips.get(split, 0)} clips "
                           f"({roads}), {self.seconds.get(split, 0.0) / 3600.0:.2f} h")
        if self.unreadable:
            out.append(f"  unreadable scenario files: {len(self.unreadable)} ({self.unreadable[0]} ...)")
        out.append(f"  {self.wall_s:.0f} s")
        return out


def convert_corpus(root: str | os.PathLike, splits_dir: str | os.PathLike, out: str | os.PathLike, *,
                   corpus: str = "ngsim", params: dict[str, Any],
                   only: list[str] | None = None, splits: tuple[str, ...] = SPLITS,
                   progress: bool = True) -> CorpusReport:
    """Convert the corpus at ``root`` with every qualifying vehicle as the ego into ``<out>/<split>``
    datasets by the split lists in ``splits_dir`` (:func:`read_splits`, checked against the corpus);
    ``only``: convert just these scenario files (paths relative to ``root``, e.g. to try a few);
    ``splits``: just these splits; ``params``: params/bev.yaml, sim.yaml and validators.yaml as loaded,
    merged (:func:`rad2_core.config.merged`). Writes ``<out>/corpus_report.json`` and returns the report."""
    from rad2_core.storage import save_dataset
    from tqdm import tqdm

    from rad2_datasets.adapters.commonroad import CommonRoadAdapterError

    start = time.perf_counter()
    criteria = EgoCriteria.from_params(params)
    root, out = Path(root), Path(out)
    lists = read_splits(splits_dir, corpus, corpus_scenarios(root, corpus))
    unknown = sorted(set(splits) - set(SPLITS))
    if unknown:
        raise CorpusError(f"splits: unknown {unknown}; known: {list(SPLITS)}")
    if only is not None:
        listed = {s for files in lists.values() for s in files}
        bad = [s for s in only if s not in listed]
        if bad:
            raise CorpusError(f"only: {bad[0]!r} is not a scenario of the corpus at {root}")
    report = CorpusReport(corpus)
    split_of = {name: split for split, files in lists.items() for name in files}
    seen: dict[tuple, str] = {}
    for split in splits:
        files = [s for s in lists[split] if only is None or s in only]
        report.scenarios[split] = len(files)
        bar = tqdm(files, desc=f"{corpus} {split}", unit="scenario", disable=not progress)

        listed = split_path(splits_dir, corpus, split)

        def clips(files=files, split=split, bar=bar, listed=listed) -> Iterator[Clip]:
            for name in bar:
                meta = {"corpus": corpus, "road": road_of(name), "scenario_file": name, "split": split}
                try:
                    for outcome in scenario_egos(root / name, params, criteria, name, meta, seen):
                        other = split_of.get(outcome.same_as, split)
                        if other != split:
                            raise CorpusError(
                                f"{listed}: {name} logs vehicle {outcome.obstacle_id} as "
                                f"{outcome.same_as} of the {other} split does: files that share traffic must "
                                "share a split "
                                "(make_splits with scenario_groups)")
                        report.add(split, road_of(name), outcome)
                        if outcome.clip is not None:
                            yield outcome.clip
                except CommonRoadAdapterError as exc:
                    report.unreadable.append(f"{name}: {exc}")
                bar.set_postfix(clips=report.clips.get(split, 0), refused=sum(report.refused.values()))

        _clear_dataset(out / split)
        save_dataset(clips(), out / split,
                     description=f"{corpus} {split} split: every qualifying vehicle as the ego "
                                 f"(rad2_datasets.corpus, scenarios of {listed})")
    report.wall_s = time.perf_counter() - start
    out.mkdir(parents=True, exist_ok=True)
    (out / "corpus_report.json").write_text(json.dumps(report.as_dict(), indent=1, sort_keys=True) + "\n")
    return report


def bundle_subset(split_dir: str | os.PathLike, out: str | os.PathLike, clips_per_road: int,
                  seed: int = SPLIT_SEED, progress: bool = True) -> list[str]:
    """Write a fixed subset of the converted split ``split_dir`` as the dataset ``out`` (plus
    ``out/clips.txt``, the clip ids chosen) and return the ids: per road ``clips_per_road`` clips (all
    when it has fewer), drawn round-robin over the road's scenario files in name order, each file's
    clips in a shuffle seeded by ``seed`` and the file's name, so every scenario is represented before
    any gives a second clip and the same split always gives the same subset."""
    from rad2_core.storage import iter_dataset, read_index, save_dataset

    if clips_per_road < 1:
        raise CorpusError(f"clips_per_road: must be >= 1, got {clips_per_road}")
    split_dir, out = Path(split_dir), Path(out)
    if out.resolve() == split_dir.resolve():
        raise CorpusError(f"out: {out} is the split itself; write the subset elsewhere")
    by_file: dict[str, list[str]] = {}
    for clip in iter_dataset(split_dir):
        name = str(clip.metadata.get("scenario_file", ""))
        if not name:
            raise CorpusError(f"{split_dir}: clip {clip.clip_id!r} has no metadata 'scenario_file' (not a "
                              "corpus split)")
        by_file.setdefault(name, []).append(clip.clip_id)
    chosen: list[str] = []
    for road in sorted({road_of(f) for f in by_file}):
        queues = []
        for name in sorted(f for f in by_file if road_of(f) == road):
            ids = sorted(by_file[name])
            rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
            queues.append([ids[i] for i in rng.permutation(len(ids))])
        picked: list[str] = []
        while len(picked) < clips_per_road and any(queues):
            for q in queues:
                if q and len(picked) < clips_per_road:
                    picked.append(q.pop(0))
        chosen += sorted(picked)
    wanted = set(chosen)
    index = read_index(split_dir)
    _clear_dataset(out)
    save_dataset((c for c in iter_dataset(split_dir) if c.clip_id in wanted), out, progress=progress,
                 description=f"fixed subset of {split_dir.name} ({index.get('description', '')}): "
                             f"{clips_per_road} clips per road, rad2_datasets.corpus.bundle_subset "
                             f"seed {seed}")
    (out / "clips.txt").write_text("".join(f"{c}\n" for c in chosen))
    return chosen


__all__ = ["CORPORA", "SPLITS", "CorpusError", "CorpusReport", "EgoCriteria", "EgoOutcome", "bundle_subset",
           "convert_corpus", "corpus_scenarios", "make_splits", "read_splits", "road_of", "scenario_egos",
           "scenario_groups",
           "write_splits"]
