"""Clip checks before the first rollout: every clip a run will drive, accepted or refused with its reason.

A clip the simulator refuses (``Simulator.init``: the log plausibility checks of
:func:`rad2_core.validators.check_clip`, the route checks of :func:`rad2_core.route_path.check_route`,
the clip's own validation, its time step) would otherwise stop an evaluation or a training run at the
first chunk that holds it, after minutes of rollouts. The entry points check every clip here first, with
the same simulator call, so a run either names all refused clips before it starts or, asked to, drives
the others and reports which it skipped and why.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bev_warp_sim.simulator import Simulator


@dataclass(frozen=True)
class RefusedClip:
    split: str  # dataset directory ("" for clips not read from one)
    clip_id: str
    reason: str

    def as_dict(self) -> dict[str, str]:
        return {"split": self.split, "clip_id": self.clip_id, "reason": self.reason}

    def __str__(self) -> str:
        where = f"{Path(self.split).name}/" if self.split else ""
        return f"{where}{self.clip_id}: {self.reason}"


@dataclass
class CheckedSplit:
    """The clips of one dataset directory a run will drive, in index order.

    ``positions[i]`` is the index position of ``clips[i]`` in the dataset (the rollout group of its
    episode, so a clip's planning seeds do not depend on which other clips were refused)."""

    split: str
    clips: list[Any] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    refused: list[RefusedClip] = field(default_factory=list)


class RefusedClipsError(ValueError):
    """Clips the simulator would refuse, every one named with its reason."""

    def __init__(self, refused: Sequence[RefusedClip], hint: str = "--skip-bad goes on without them"):
        self.refused = list(refused)
        lines = "\n".join(f"  {r}" for r in self.refused)
        super().__init__(f"{len(self.refused)} clip(s) the simulator refuses ({hint}):\n{lines}")


def refusal(simulator: Simulator, clip: Any) -> str | None:
    """Why ``simulator`` would refuse to start an episode of ``clip`` (None: it accepts it): the
    simulator's own acceptance, so no check here can drift from what a rollout would meet."""
    from rad2_core.field_checks import ClipValidationError

    try:
        simulator.init([clip], 0)
    except (ValueError, ClipValidationError) as exc:  # SimulationError, PlausibilityError, RouteError
        return str(exc)
    return None


def check_clips(clips: Sequence[Any], simulator: Simulator, split: str = "", positions=None,
                progress: bool = False) -> CheckedSplit:
    """Already loaded clips, checked one by one (``positions``: their dataset index positions)."""
    from tqdm import tqdm

    out = CheckedSplit(split=str(split))
    positions = list(range(len(clips))) if positions is None else list(positions)
    for clip, pos in tqdm(list(zip(clips, positions)), desc=f"checking {Path(split).name or 'clips'}",
                          unit="clip", disable=not progress, leave=False):
        why = refusal(simulator, clip)
        if why is None:
            out.clips.append(clip)
            out.positions.append(int(pos))
        else:
            out.refused.append(RefusedClip(str(split), str(clip.clip_id), why))
    return out


def check_split(directory: str | Path, simulator: Simulator, max_clips: int | None = None,
                progress: bool = False, select=None) -> CheckedSplit:
    """The first ``max_clips`` clips of a dataset directory (all by default; ``select(entries)`` picks
    index positions instead), each loaded and checked: a clip file that does not load is refused
    too, named by its index entry. ``ClipFormatError`` when the directory has no readable index."""
    from rad2_core.field_checks import ClipValidationError
    from rad2_core.storage import ClipFormatError, load_clip, read_index
    from tqdm import tqdm

    directory = Path(directory)
    entries = read_index(directory)["clips"]
    if select is not None:
        picked = list(select(entries))
    else:
        picked = list(range(len(entries) if max_clips is None else min(len(entries), int(max_clips))))
    out = CheckedSplit(split=str(directory))
    cache: dict[str, Any] = {}
    for pos in tqdm(picked, desc=f"checking {directory.name}", unit="clip", disable=not progress,
                    leave=False):
        entry = entries[pos]
        name = str(entry.get("clip_id", entry.get("file", f"#{pos}")))
        try:
            clip = load_clip(directory / entry["file"], maps_dir=directory / "maps", map_cache=cache)
        except (ClipFormatError, ClipValidationError, KeyError) as exc:
            out.refused.append(RefusedClip(str(directory), name, f"does not load: {exc}"))
            continue
        why = refusal(simulator, clip)
        if why is None:
            out.clips.append(clip)
            out.positions.append(int(pos))
        else:
            out.refused.append(RefusedClip(str(directory), name, why))
    return out


def check_splits(directories: Sequence[str | Path], simulator: Simulator, *, max_clips: int | None = None,
                 skip_bad: bool = False, progress: bool = False, select=None) -> list[CheckedSplit]:
    """:func:`check_split` of every directory; :class:`RefusedClipsError` listing the refused clips of all
    of them unless ``skip_bad``."""
    checked = [check_split(d, simulator, max_clips=max_clips, progress=progress, select=select)
               for d in directories]
    refused = [r for c in checked for r in c.refused]
    if refused and not skip_bad:
        raise RefusedClipsError(refused)
    return checked


def refused_lines(refused: Sequence[RefusedClip]) -> list[str]:
    """One line per skipped clip, for a report."""
    return [f"skipped {r}" for r in refused]


def accepted_view(checked: CheckedSplit, directory: str | Path) -> Path:
    """A dataset directory ``directory/<split name>`` that lists only ``checked``'s accepted clips: its
    own index.json, with ``clips/`` and ``maps/`` linked to the original's (nothing is copied), for a
    consumer that reads a dataset directory itself (the imitation trainer's feature cache, keyed by the
    index it reads)."""
    import json

    from rad2_core.storage import INDEX_FILE, read_index

    src = Path(checked.split).resolve()
    index = read_index(src)
    keep = set(checked.positions)
    index["clips"] = [e for i, e in enumerate(index["clips"]) if i in keep]
    index["num_clips"] = len(index["clips"])
    kinds: dict[str, int] = {}
    for e in index["clips"]:
        kinds[e.get("kind", "")] = kinds.get(e.get("kind", ""), 0) + 1
    index["kinds"] = kinds
    index["refused"] = [r.as_dict() for r in checked.refused]
    view = Path(directory) / src.name
    view.mkdir(parents=True, exist_ok=True)
    for part in ("clips", "maps"):
        link = view / part
        if link.is_symlink() or link.exists():
            if link.resolve() == (src / part).resolve():
                continue
            link.unlink()
        link.symlink_to(src / part, target_is_directory=True)
    (view / INDEX_FILE).write_text(json.dumps(index, indent=1, sort_keys=True))
    return view
