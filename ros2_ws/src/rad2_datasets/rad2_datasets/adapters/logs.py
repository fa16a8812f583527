"""Real driving logs of any supported format -> clips and clip datasets (no ROS).

One entry point for every reader of this package, so that tools take whatever a user has on disk:

=================  =====================================================================  ==========
format             what is on disk                                                          clips
=================  =====================================================================  ==========
``av2``            Argoverse 2 motion-forecasting scenario: a directory holding            1
                   ``scenario_*.parquet`` and ``log_map_archive_*.json``
``av2_sensor``     Argoverse 2 sensor log: a directory holding ``annotations.feather``,     1
                   ``city_SE3_egovehicle.feather`` and ``map/log_map_archive_*.json``
``commonroad``     CommonRoad scenario ``*.xml`` (NGSIM and others; no recorded ego: the    1 per ego
                   best ``egos_per_scenario`` candidates of ``rank_egos`` each give a clip)
``womd``           Waymo Open Motion TFRecord ``*.tfrecord*`` (one clip per ``Scenario``)   many
``interaction``    INTERACTION dataset track file ``*.csv`` (recognised by its header;      1 per ego
                   the map ``<root>/maps/<location>.osm`` for
                   ``<root>/recorded_trackfiles/<location>/vehicle_tracks_NNN.csv``, else a
                   ``.osm`` beside it; no recorded ego: the best ``egos_per_scenario``
                   vehicles, each a window of its track)
``clip``           a clip ``.npz`` written by this project                                 1
``dataset``        a clip dataset directory of this project (``index.json``)               many
=================  =====================================================================  ==========

:func:`find_logs` walks the given files and directories (recursively) and names the format of each
log it finds; :func:`iter_log_clips` reads them; :func:`convert_logs` writes them as one dataset that
``rad2 eval policy --split`` and the training tools read. Every reader hands back clips at the
simulator's step (see the readers' modules).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rad2_core.clip import Clip

FORMATS = ("av2", "av2_sensor", "commonroad", "womd", "interaction", "clip", "dataset")


class LogFormatError(ValueError):
    """A path that is no log of a known format, or a log that does not convert (names the path)."""


@dataclass(frozen=True)
class LogSource:
    format: str  # one of FORMATS
    path: Path


def log_format(path: str | os.PathLike) -> str | None:
    """The format of the log at ``path`` (a file or a directory), or None when it is none of
    :data:`FORMATS` (a directory that merely contains logs is None too: see :func:`find_logs`)."""
    path = Path(path)
    if path.is_file():
        name = path.name.lower()
        if name.endswith(".xml"):
            return "commonroad"
        if ".tfrecord" in name:
            return "womd"
        if name.endswith(".npz"):
            return "clip"
        if name.startswith("scenario_") and name.endswith(".parquet"):
            return "av2"
        if name.endswith(".csv"):
            from rad2_datasets.adapters.interaction import track_file_kind

            # a pedestrian track file is read with the vehicle file of its number, not on its own
            return "interaction" if track_file_kind(path) == "vehicle" else None
        return None
    if not path.is_dir():
        return None
    if (path / "index.json").is_file():
        return "dataset"
    if any(path.glob("scenario_*.parquet")) and any(path.glob("log_map_archive_*.json")):
        return "av2"
    if (path / "annotations.feather").is_file() and (path / "city_SE3_egovehicle.feather").is_file():
        return "av2_sensor"
    return None


def find_logs(inputs: str | os.PathLike | Iterable[str | os.PathLike],
              formats: Iterable[str] | None = None) -> list[LogSource]:
    """Every log under ``inputs`` (files and directories, searched recursively; a log's own directory
    is not searched further), in path order, optionally only of the given ``formats``. Raises
    :class:`LogFormatError` naming an input that does not exist, a given file of no known format, or
    inputs that hold no log at all."""
    if isinstance(inputs, (str, os.PathLike)):
        inputs = [inputs]
    wanted = set(FORMATS if formats is None else formats)
    unknown = wanted - set(FORMATS)
    if unknown:
        raise LogFormatError(f"formats: unknown {sorted(unknown)}; known: {list(FORMATS)}")
    found: list[LogSource] = []
    for item in inputs:
        path = Path(item)
        if not path.exists():
            raise LogFormatError(f"{path}: no such file or directory")
        fmt = log_format(path)
        if path.is_file() and fmt is None:
            raise LogFormatError(f"{path}: not a log of a known format ({', '.join(FORMATS)})")
        if fmt is not None:
            if fmt in wanted:
                found.append(LogSource(fmt, path))
            continue
        for root, dirs, files in os.walk(path):
            root_path = Path(root)
            here = log_format(root_path)
            if here is not None and root_path != path:
                if here in wanted:
                    found.append(LogSource(here, root_path))
                dirs[:] = []
                continue
            dirs.sort()
            for name in sorted(files):
                sub = root_path / name
                sub_fmt = log_format(sub)
                # a scenario parquet belongs to its AV2 directory, found as a directory
                if sub_fmt in ("commonroad", "womd", "interaction", "clip") and sub_fmt in wanted:
                    found.append(LogSource(sub_fmt, sub))
    if not found:
        raise LogFormatError(
            f"no log of the formats {sorted(wanted)} under {', '.join(str(p) for p in inputs)}")
    return found


def plausible_clip(clip: Clip, source: str, params: dict[str, Any]) -> Clip:
    """A converted log as the simulator will take it: agent states that no road user can have (a
    tracker's glitch) marked invalid and counted in ``metadata["implausible_agent_states"]``;
    :class:`LogFormatError` naming ``source`` and the fields when the ego itself is impossible
    (rad2_core.validators, bounds of params/validators.yaml: ``params`` holds its block)."""
    from dataclasses import replace

    from rad2_core.validators import (
        PlausibilityError,
        check_clip,
        invalidate_implausible_agent_states,
        load_limits,
    )

    limits = load_limits(params)
    clip, changed = invalidate_implausible_agent_states(clip, limits)
    bad = check_clip(clip, limits)
    if bad:
        what = f"{source}: clip {clip.clip_id!r} logs the impossible"
        raise LogFormatError(str(PlausibilityError(what, bad)))
    if changed:
        clip = replace(clip, metadata={**clip.metadata, "implausible_agent_states": changed})
    return clip


def clips_in_log(source: LogSource, params: dict[str, Any], *, egos_per_scenario: int = 1,
                 errors: list[str] | None = None, verify_crc: bool = True) -> Iterator[Clip]:
    """The clips of one log (readers' clips through :func:`plausible_clip`). ``params``:
    params/bev.yaml, sim.yaml and validators.yaml as loaded, merged
    (:func:`rad2_core.config.merged`); ``verify_crc``: check WOMD TFRecord CRCs (off: faster, corruption
    then shows as decode errors). With an ``errors`` list, a WOMD record or a CommonRoad or INTERACTION
    ego that does not convert is skipped and its message appended; otherwise, and for a log that does
    not open at all, :class:`LogFormatError` names the log."""
    fmt, path = source.format, source.path
    try:
        if fmt == "av2":
            from rad2_datasets.adapters.av2 import load_av2_scenario

            yield plausible_clip(load_av2_scenario(path, params), str(path), params)
        elif fmt == "av2_sensor":
            from rad2_datasets.adapters.av2_sensor import load_av2_sensor_log

            yield plausible_clip(load_av2_sensor_log(path, params), str(path), params)
        elif fmt == "commonroad":
            from rad2_core.route_path import RouteError

            from rad2_datasets.adapters.commonroad import (
                CommonRoadAdapterError,
                commonroad_ego_candidates,
                load_commonroad_scenario,
            )

            for ego in commonroad_ego_candidates(path, params)[:egos_per_scenario]:
                try:
                    clip = plausible_clip(load_commonroad_scenario(path, ego_obstacle_id=ego, params=params),
                                          f"{path}: ego {ego}", params)
                except (CommonRoadAdapterError, LogFormatError, RouteError) as exc:
                    if errors is None:
                        raise
                    errors.append(f"{path}: ego {ego}: {exc}")
                    continue
                yield clip
        elif fmt == "womd":
            from rad2_datasets.adapters.womd import iter_womd_clips

            for clip in iter_womd_clips(path, params, errors=errors, verify_crc=verify_crc):
                try:
                    yield plausible_clip(clip, str(path), params)
                except LogFormatError as exc:
                    if errors is None:
                        raise
                    errors.append(str(exc))
        elif fmt == "interaction":
            from rad2_datasets.adapters.interaction import iter_interaction_clips

            yield from iter_interaction_clips(path, params, egos_per_scenario=egos_per_scenario,
                                              errors=errors)
        elif fmt == "clip":
            from rad2_core.storage import load_clip

            yield load_clip(path)
        elif fmt == "dataset":
            from rad2_core.storage import iter_dataset

            yield from iter_dataset(path)
        else:
            raise LogFormatError(f"{path}: unknown format {fmt!r}; known: {list(FORMATS)}")
    except LogFormatError:
        raise
    except Exception as exc:  # noqa: BLE001 - a reader's own failure (parser, decoder, validation) named by log
        raise LogFormatError(f"{path} ({fmt}): {type(exc).__name__}: {exc}") from exc


def load_log(path: str | os.PathLike, params: dict[str, Any]) -> Clip:
    """The first clip of the log at ``path`` (any format of :data:`FORMATS`; ``params`` as for
    :func:`clips_in_log`)."""
    fmt = log_format(path)
    if fmt is None:
        raise LogFormatError(f"{path}: not a log of a known format ({', '.join(FORMATS)})")
    for clip in clips_in_log(LogSource(fmt, Path(path)), params):
        return clip
    raise LogFormatError(f"{path} ({fmt}): holds no clip")


def convert_logs(inputs, out: str | os.PathLike, params: dict[str, Any], *,
                 formats: Iterable[str] | None = None, egos_per_scenario: int = 1, limit: int | None = None,
                 append: bool = False, skip_bad: bool = False, verify_crc: bool = True, progress: bool = True
                 ) -> tuple[int, dict[str, Any], list[str]]:
    """Write every clip of the logs under ``inputs`` into the dataset ``out``; returns (clips written,
    the index, the messages of the logs skipped with ``skip_bad``). Without ``skip_bad`` the first log
    that does not convert raises :class:`LogFormatError` naming it (nothing is written to the index).
    ``params`` as for :func:`clips_in_log`."""
    from rad2_core.storage import save_dataset
    from tqdm import tqdm

    if egos_per_scenario < 1:
        raise LogFormatError(f"egos_per_scenario: must be >= 1, got {egos_per_scenario}")
    if limit is not None and limit < 1:
        raise LogFormatError(f"limit: must be >= 1, got {limit}")
    sources = find_logs(inputs, formats)
    errors: list[str] = []
    count = 0
    total = sum(_expected_clips(src, egos_per_scenario) for src in sources)
    bar = tqdm(total=min(total, limit) if limit is not None else total, unit="clip", desc="converting",
               disable=not progress)

    def clips() -> Iterator[Clip]:
        nonlocal count
        for source in sources:
            bar.set_postfix_str(source.path.name)
            try:
                for clip in clips_in_log(source, params, egos_per_scenario=egos_per_scenario,
                                         errors=errors if skip_bad else None, verify_crc=verify_crc):
                    if limit is not None and count >= limit:
                        return
                    count += 1
                    bar.update()
                    yield clip
            except LogFormatError as exc:
                if not skip_bad:
                    raise
                errors.append(str(exc))

    described = ", ".join(f"{s.format}:{s.path}" for s in sources[:3]) + (" ..." if len(sources) > 3 else "")
    with bar:
        index = save_dataset(clips(), out, append=append,
                             description=f"real logs converted by rad2 data convert from {described}")
    return count, index, errors


def _expected_clips(source: LogSource, egos_per_scenario: int) -> int:
    """The clips a log should give, for the progress bar (a WOMD file: its record count; a CommonRoad
    scene: at most ``egos_per_scenario``; a dataset: its index)."""
    if source.format == "womd":
        from rad2_datasets.adapters.womd import count_tfrecords

        try:
            return count_tfrecords(source.path)
        except Exception:  # noqa: BLE001 - a broken file is reported when it is read, not here
            return 1
    if source.format in ("commonroad", "interaction"):
        return egos_per_scenario
    if source.format == "dataset":
        from rad2_core.storage import read_index

        try:
            return int(read_index(source.path)["num_clips"])
        except Exception:  # noqa: BLE001 - as above
            return 1
    return 1


__all__ = ["FORMATS", "LogFormatError", "LogSource", "clips_in_log", "convert_logs", "find_logs", "load_log",
           "log_format"]
