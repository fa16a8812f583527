"""What an evaluation has finished, kept on disk as it goes, so an interrupted run loses nothing it drove.

``<out>/episodes.jsonl``: one line per finished episode (run label, split, evaluation seed, the clip's
content key and its :class:`~bev_warp_sim.metrics.EpisodeResult`), written and flushed as each chunk of
clips comes back. ``<out>/run_settings.json``: per run label (a policy, an experiment arm) every setting
that changes its results; a resumed run must have the same ones. ``<out>/episodes/``: the driven track
and the planner's decisions (candidates, scores, the chosen one) of the episodes that are among the
worst so far, which the GIFs show; they are few, so the disk holds a few files per split, not one per clip.

A resumed run (:class:`EpisodeLog` with ``resume=True``) reads all three back: the evaluation skips every
chunk of clips whose episodes are all there and drives the rest exactly as the uninterrupted run would
have (same chunks, same seeds), so its table equals that run's.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from bev_warp_sim.metrics import EpisodeResult

EPISODES_FILE = "episodes.jsonl"
SETTINGS_FILE = "run_settings.json"
RECORDS_DIR = "episodes"


class SettingsMismatch(ValueError):
    """A resumed run whose settings differ from those its finished episodes were driven with."""


@dataclass(frozen=True)
class DecisionView:
    """What a picture of one planning decision needs (a compact copy of a DecisionPoint)."""

    step: int
    pose: np.ndarray  # [3] x, y, yaw of the ego at the decision (the plans' frame)
    selected: int
    trajectory: np.ndarray  # [T, 2] executed plan, ego frame
    candidates: np.ndarray | None  # [M, T, 2] ego frame (None: the policy proposes one plan)
    scores: np.ndarray | None  # [M] discriminator scores, sigmoid (NaN where not scored)
    logits: np.ndarray | None = None  # [M] logits the selection ranked (NaN where not scored)
    plan_dt: float = float("nan")  # s between the plans' waypoints


@dataclass
class EpisodeRecord:
    """The driven track of one episode and its decisions (for GIFs)."""

    track: np.ndarray  # [n, 6] x, y, yaw, v, delta, accel
    agent_track: list[np.ndarray] | None  # reactive agents: per step [N, 3]
    decisions: list[DecisionView]


def episode_record(rollout) -> EpisodeRecord:
    """The record of a :class:`bev_warp_sim.rollout.Rollout` (float32 plans: a picture's precision)."""
    views = []
    for d in rollout.trace.decisions:
        cand = None if d.candidates is None else np.asarray(d.candidates, np.float32)
        scores = None if d.scores is None else np.asarray(d.scores, np.float32).reshape(-1)
        logits = None if d.logits is None else np.asarray(d.logits, np.float32).reshape(-1)
        traj = np.asarray(d.trajectory if d.trajectory is not None else np.zeros((0, 2)), np.float32)
        views.append(DecisionView(int(d.step), np.asarray(d.ego_state[:3], np.float64), int(d.selected), traj,
                                  cand, scores, logits, float(d.info.get("plan_dt", np.nan))))
    agents = [np.asarray(a) for a in rollout.agent_track] if rollout.agent_track else None
    return EpisodeRecord(np.asarray(rollout.trace.ego), agents, views)


def _save_record(record: EpisodeRecord, path: Path) -> None:
    dec = record.decisions
    arrays: dict[str, np.ndarray] = {
        "track": np.asarray(record.track),
        "dec_step": np.array([d.step for d in dec], np.int64),
        "dec_pose": np.array([d.pose for d in dec], np.float64).reshape(-1, 3),
        "dec_selected": np.array([d.selected for d in dec], np.int64),
        "dec_plan_dt": np.array([d.plan_dt for d in dec], np.float64),
        "traj_len": np.array([len(d.trajectory) for d in dec], np.int64),
        "traj": np.concatenate([d.trajectory for d in dec] or [np.zeros((0, 2), np.float32)]).reshape(-1, 2),
        # candidates of decision k: cand_shape[k] = (M, T), (0, 0) when the policy proposed one plan
        "cand_shape": np.array([(0, 0) if d.candidates is None else d.candidates.shape[:2] for d in dec],
                               np.int64).reshape(-1, 2),
        "cand": np.concatenate([d.candidates.reshape(-1, 2) for d in dec if d.candidates is not None]
                               or [np.zeros((0, 2), np.float32)]),
        "scores": np.concatenate([_per_candidate(d, d.scores) for d in dec if d.candidates is not None]
                                 or [np.zeros(0, np.float32)]),
        "logits": np.concatenate([_per_candidate(d, d.logits) for d in dec if d.candidates is not None]
                                 or [np.zeros(0, np.float32)]),
    }
    if record.agent_track is not None:
        arrays["agent_track"] = np.asarray(record.agent_track)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp.npz")
    np.savez_compressed(tmp, **arrays)
    tmp.replace(path)


def _per_candidate(d: DecisionView, values: np.ndarray | None) -> np.ndarray:
    m = d.candidates.shape[0]
    if values is None or values.shape != (m,):
        return np.full(m, np.nan, np.float32)
    return values.astype(np.float32)


def _load_record(path: Path) -> EpisodeRecord:
    with np.load(path, allow_pickle=False) as z:
        a = {k: z[k] for k in z.files}
    views = []
    t0 = c0 = s0 = 0
    for k in range(len(a["dec_step"])):
        n = int(a["traj_len"][k])
        traj = a["traj"][t0:t0 + n]
        t0 += n
        m, t = (int(v) for v in a["cand_shape"][k])
        cand = scores = logits = None
        if m:
            cand = a["cand"][c0:c0 + m * t].reshape(m, t, 2)
            scores = a["scores"][s0:s0 + m]
            logits = a["logits"][s0:s0 + m] if "logits" in a else None
            c0 += m * t
            s0 += m
        views.append(DecisionView(int(a["dec_step"][k]), a["dec_pose"][k], int(a["dec_selected"][k]), traj,
                                  cand, scores, logits, float(a["dec_plan_dt"][k])))
    agents = list(a["agent_track"]) if "agent_track" in a else None
    return EpisodeRecord(a["track"], agents, views)


def flat_settings(tree: Any, prefix: str = "") -> dict[str, Any]:
    """``{"a.b.c": value}`` of nested dicts (lists and scalars are values), JSON-normalised so a
    setting read back from the file compares equal to the same setting made now."""
    if isinstance(tree, dict) and tree:
        out: dict[str, Any] = {}
        for k, v in tree.items():
            out.update(flat_settings(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: json.loads(json.dumps(tree, default=str))}


def _same(a: Any, b: Any) -> bool:
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)  # NaN equals NaN here


def checkpoint_digest(directory: str | Path) -> str:
    """A content hash of a planner checkpoint's config and weights (its cached exported graphs are
    derived from them and left out)."""
    directory = Path(directory)
    h = hashlib.sha1()
    files = sorted(p for p in directory.iterdir() if p.is_file() and p.suffix in (".json", ".safetensors"))
    for p in files:
        h.update(p.name.encode())
        with p.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()[:16]


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-") or "x"


class EpisodeLog:
    """The finished episodes of an evaluation under ``out`` (see the module docstring).

    ``resume=False`` starts over (the files of an earlier run in ``out`` are replaced); ``resume=True``
    reads them back and ValueError when ``out`` holds none."""

    def __init__(self, out: str | Path, resume: bool = False):
        self.out = Path(out)
        self.resume = bool(resume)
        self.path = self.out / EPISODES_FILE
        self.settings_path = self.out / SETTINGS_FILE
        self.records_dir = self.out / RECORDS_DIR
        self.settings: dict[str, dict[str, Any]] = {}
        self._done: dict[tuple[str, str, int], dict[str, EpisodeResult]] = {}
        if resume:
            if not self.path.is_file():
                raise ValueError(f"--resume: {self.out} holds no {EPISODES_FILE} (nothing to resume)")
            self._cut_torn_tail()
            if self.settings_path.is_file():
                self.settings = json.loads(self.settings_path.read_text())
            self._read()
        else:
            self.out.mkdir(parents=True, exist_ok=True)
            self.path.write_text("")
            self.settings_path.unlink(missing_ok=True)
            if self.records_dir.is_dir():
                for p in self.records_dir.rglob("*.npz"):
                    p.unlink()
        self._fh = self.path.open("a")

    # -- settings -------------------------------------------------------------------------------------
    def use_settings(self, run: str, settings: dict[str, Any]) -> None:
        """Record the settings of ``run``; on a resumed run, SettingsMismatch naming every setting that
        differs from those its finished episodes were driven with."""
        settings = flat_settings(settings)
        old = self.settings.get(run)
        if self.resume and old is not None and not _same(old, settings):
            lines = [f"{k}: was {old.get(k, '(unset)')!r}, now {settings.get(k, '(unset)')!r}"
                     for k in sorted(set(old) | set(settings))
                     if not _same(old.get(k, "(unset)"), settings.get(k, "(unset)"))]
            raise SettingsMismatch(
                f"--resume: {self.out} was run for {run!r} with other settings ({self.settings_path}); "
                "resume with the same ones or start a new --out:\n  " + "\n  ".join(lines))
        self.settings[run] = settings
        tmp = self.settings_path.with_name(SETTINGS_FILE + ".tmp")
        tmp.write_text(json.dumps(self.settings, indent=1, sort_keys=True))
        tmp.replace(self.settings_path)

    # -- episodes -------------------------------------------------------------------------------------
    def done(self, run: str, split: str, seed: int) -> dict[str, EpisodeResult]:
        """``{clip key: result}`` of the episodes finished for (run, split, seed)."""
        return dict(self._done.get((run, self._split(split), int(seed)), {}))

    def add(self, run: str, split: str, seed: int, clip_key: str, result: EpisodeResult) -> None:
        line = {"run": run, "split": self._split(split), "seed": int(seed), "clip_key": clip_key,
                "result": result.as_dict()}
        self._fh.write(json.dumps(line) + "\n")
        self._done.setdefault((run, self._split(split), int(seed)), {})[clip_key] = result

    def flush(self) -> None:
        self._fh.flush()
        os.fsync(self._fh.fileno())

    def close(self) -> None:
        if not self._fh.closed:
            self.flush()
            self._fh.close()

    def __enter__(self) -> EpisodeLog:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- records of the episodes a GIF may show ---------------------------------------------------------
    def record_path(self, run: str, split: str, seed: int, clip_id: str) -> Path:
        return self.records_dir / _safe(run) / _safe(Path(split).name) / f"{_safe(clip_id)}_s{int(seed)}.npz"

    def save_record(self, run: str, split: str, seed: int, clip_id: str, record: EpisodeRecord) -> None:
        _save_record(record, self.record_path(run, split, seed, clip_id))

    def load_record(self, run: str, split: str, seed: int, clip_id: str) -> EpisodeRecord | None:
        path = self.record_path(run, split, seed, clip_id)
        return _load_record(path) if path.is_file() else None

    def drop_record(self, run: str, split: str, seed: int, clip_id: str) -> None:
        self.record_path(run, split, seed, clip_id).unlink(missing_ok=True)

    # -- internals ------------------------------------------------------------------------------------
    @staticmethod
    def _split(split: str) -> str:
        return str(Path(split).resolve())

    def _cut_torn_tail(self) -> None:
        """A run killed while writing leaves a last line without its newline: cut it, so the next line
        starts on its own (the episode it held is driven again)."""
        data = self.path.read_bytes()
        if data and not data.endswith(b"\n"):
            with self.path.open("r+b") as f:
                f.truncate(data.rfind(b"\n") + 1)

    def _read(self) -> None:
        with self.path.open() as f:
            for n, text in enumerate(f, 1):
                if not text.strip():
                    continue
                try:
                    line = json.loads(text)
                    result = EpisodeResult(**line["result"])
                    key = (str(line["run"]), str(line["split"]), int(line["seed"]))
                except (ValueError, KeyError, TypeError) as exc:
                    raise ValueError(f"--resume: {self.path} line {n} is not an episode record "
                                     f"({exc})") from None
                self._done.setdefault(key, {})[str(line["clip_key"])] = result
