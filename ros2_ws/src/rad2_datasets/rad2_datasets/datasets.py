"""Operations on whole clip datasets (index.json, clips/, maps/): what a converted dataset holds by
source, merging datasets into a new one, and picking one clip from a dataset or any log.

Used by ``rad2 data convert``, ``rad2 data merge`` and ``rad2 data render``.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from rad2_core.clip import AGENT_CYCLIST, AGENT_PEDESTRIAN, AGENT_VEHICLE, Clip
from rad2_core.storage import iter_dataset, load_clip, read_index, save_dataset


def composition(directory: str | Path) -> list[dict]:
    """One row per source format of the dataset: clips, minutes, mean ego speed, agents per step, agents
    by type and lanes per map."""
    import numpy as np

    rows: dict[str, dict] = {}
    for clip in iter_dataset(directory):
        src = str(clip.metadata.get("source", "clip"))
        r = rows.setdefault(src, {"source": src, "clips": 0, "seconds": 0.0, "speeds": [], "agents": [],
                                  "vehicles": 0, "pedestrians": 0, "cyclists": 0, "lanes": []})
        r["clips"] += 1
        r["seconds"] += clip.duration_s
        r["speeds"].append(float(np.mean(clip.ego_speed)))
        r["agents"].append(float(clip.agent_valid.sum(axis=0).mean()) if clip.num_agents else 0.0)
        types = np.asarray(clip.agent_types)
        r["vehicles"] += int((types == AGENT_VEHICLE).sum())
        r["pedestrians"] += int((types == AGENT_PEDESTRIAN).sum())
        r["cyclists"] += int((types == AGENT_CYCLIST).sum())
        r["lanes"].append(clip.map.num_lanes)
    out = []
    for r in rows.values():
        out.append({"source": r["source"], "clips": r["clips"], "min": r["seconds"] / 60.0,
                    "ego m/s": float(np.mean(r["speeds"])), "agents/step": float(np.mean(r["agents"])),
                    "veh": r["vehicles"], "ped": r["pedestrians"], "cyc": r["cyclists"],
                    "lanes/map": float(np.mean(r["lanes"]))})
    return out


class MergeError(ValueError):
    """The inputs cannot be merged (not a dataset, a clip id in two of them, an output that exists)."""


class MergeClipError(RuntimeError):
    """A clip did not load or validate while merging; ``clip`` names its file. Nothing was written."""

    def __init__(self, clip: str, reason: Exception):
        super().__init__(f"clip {clip}: {reason}")
        self.clip = clip


def merge_datasets(inputs: Sequence[str | Path], out: str | Path, progress: bool = True) -> int:
    """Merge the datasets ``inputs`` (in order) into the new directory ``out``; returns the clips written.

    Clips are loaded and validated one by one and written with ``rad2_core.storage.save_dataset`` (each
    map once). Clip ids must be unique across the inputs: a repeated id is refused (``MergeError`` naming
    both datasets), since replacing one clip by another of the same name would silently change a
    training set. The merge is written to ``<out>.partial`` and renamed only when every clip loaded and
    validated, so a bad clip (``MergeClipError``) leaves no half-merged dataset behind; the inputs are
    only read.
    """
    inputs = [Path(d) for d in inputs]
    out = Path(out)
    if out.exists():
        raise MergeError(f"{out} exists; merge into a new directory")
    seen: dict[str, Path] = {}
    for directory in inputs:
        if not (directory / "index.json").is_file():
            raise MergeError(f"{directory} is not a dataset (no index.json)")
        for entry in read_index(directory)["clips"]:
            if entry["clip_id"] in seen:
                raise MergeError(f"clip_id {entry['clip_id']!r} is in both {seen[entry['clip_id']]} and "
                                 f"{directory}")
            seen[entry["clip_id"]] = directory
    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)  # left by an interrupted earlier merge
    current = ""

    def clips_of(directory: Path) -> Iterator[Clip]:
        nonlocal current
        maps: dict = {}
        for entry in read_index(directory)["clips"]:
            current = str(directory / entry["file"])
            yield load_clip(directory / entry["file"], maps_dir=directory / "maps", map_cache=maps)

    try:
        for i, directory in enumerate(inputs):
            save_dataset(clips_of(directory), partial, append=i > 0, progress=progress,
                         description=f"merged from {[str(d) for d in inputs]}")
    except (OSError, ValueError, KeyError) as exc:
        shutil.rmtree(partial, ignore_errors=True)
        raise MergeClipError(current, exc) from exc
    partial.rename(out)
    return len(seen)


class ClipNotFoundError(LookupError):
    """A dataset has no clip of that id, or fewer clips than that index."""

    def __str__(self) -> str:  # LookupError would quote the message like a key
        return str(self.args[0])


def pick_clip(source: str | Path, params: dict[str, Any], clip_id: str | None = None, index: int = 0) -> Clip:
    """A clip from a dataset directory (by ``clip_id``, else the ``index``-th of its index) or from any log
    ``rad2_datasets.adapters.logs`` reads (a clip .npz, an AV2 scenario or sensor log, CommonRoad XML,
    WOMD; ``params`` as :func:`~rad2_datasets.adapters.logs.clips_in_log` takes them);
    ``ClipNotFoundError`` naming the clip id or index, ``LogFormatError`` for a source it cannot
    read."""
    from rad2_datasets.adapters.logs import load_log

    source = Path(source)
    if source.is_dir() and (source / "index.json").is_file():
        entries = read_index(source)["clips"]
        if clip_id is not None:
            if clip_id not in {e["clip_id"] for e in entries}:
                raise ClipNotFoundError(f"clip id {clip_id!r} is not in {source}/index.json")
        elif not 0 <= index < len(entries):
            raise ClipNotFoundError(f"clip index {index} outside 0..{len(entries) - 1} of {source}")
        want = clip_id if clip_id is not None else entries[index]["clip_id"]
        for c in iter_dataset(source):
            if c.clip_id == want:
                return c
    return load_log(source, params)
