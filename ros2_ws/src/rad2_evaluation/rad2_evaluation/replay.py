"""Open-loop replay evaluation: a perception-inputs bag read back as a log, plans scored against it.

A bag written by rad2_datasets.input_bags (rad2 data to-bag) is read into the steps a player
publishes and the logged scene (ego odometry and agent boxes per step). The planner outputs of a replay
(one :class:`Cycle` per step) are scored by :func:`open_loop_summary` with
rad2_core.open_loop_metrics against the logged future: the source clip named by the bag metadata
when it loads and matches the odometry (with the BEV drivable area for the offroad check), otherwise a
clip-like log built from the bag itself; the report's table and plots. No rclpy; the ROS player is
rad2_bringup.replay_player, the CLI rad2 eval replay.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from rad2_datasets import bags
from rad2_datasets.input_bags import TOPIC_CLOCK, TOPIC_OBJECTS, TOPIC_ODOM, load_clip_source

INPUT_TOPICS = [TOPIC_CLOCK, TOPIC_ODOM, TOPIC_OBJECTS]


class ReplayError(RuntimeError):
    """The bag lacks what replay needs, the nodes did not start, or no plan came back."""


@dataclass
class Step:
    """Everything the player publishes at one log time."""

    index: int
    stamp_ns: int
    messages: list[tuple[str, str, bytes]] = field(default_factory=list)  # (topic, msgtype, CDR)


@dataclass
class LoggedScene:
    """The log the plans are scored against: ego poses and agent boxes per step (world frame)."""

    stamps_ns: np.ndarray  # [S]
    ego: np.ndarray  # [S, 3] x, y, yaw (from odometry)
    ego_speed: np.ndarray  # [S]
    agents: list[dict[str, np.ndarray]]  # per step: ids, x, y, yaw, length, width, vx, vy, type


def read_replay_bag(path: str | Path, max_steps: int | None = None) -> tuple[list[Step], LoggedScene, dict]:
    """Steps to publish, the logged scene and the rad2 metadata of a perception-inputs bag.

    The messages are decoded by rad2_ros.conversions (the one message converter, duck-typed
    over rosbags and rclpy objects); it is imported here, not at module level, because it needs the
    built rad2_msgs while scoring (open_loop_summary) does not.
    """
    from rad2_ros import conversions as rc

    with bags.BagReader(path) as reader:
        reader.check_topics([TOPIC_ODOM, TOPIC_OBJECTS])
        topics = [t for t in INPUT_TOPICS if t in reader.topics]
        meta = reader.custom_data
        by_stamp: dict[int, Step] = {}
        odom: dict[int, tuple[float, float, float, float]] = {}
        objects: dict[int, dict[str, np.ndarray]] = {}
        for m in reader.messages(topics, raw=True):
            step = by_stamp.setdefault(m.log_time_ns, Step(len(by_stamp), m.log_time_ns))
            step.messages.append((m.topic, m.msgtype, bytes(m.msg)))
            if m.topic == TOPIC_ODOM:
                ego = rc.odometry_from_msg(bags.deserialize(m.msg, m.msgtype, reader.store))
                odom[m.log_time_ns] = (ego.x, ego.y, ego.yaw, ego.speed)
            elif m.topic == TOPIC_OBJECTS:
                a, _, _ = rc.perception_inputs_from_msg(bags.deserialize(m.msg, m.msgtype, reader.store))
                objects[m.log_time_ns] = {
                    "ids": a.ids, "type": a.types.astype(np.int64), "x": a.x, "y": a.y, "yaw": a.yaw,
                    "length": a.length, "width": a.width, "vx": a.vx, "vy": a.vy,
                }
    steps = [s for s in by_stamp.values() if any(t == TOPIC_OBJECTS for t, _, _ in s.messages)]
    if not steps:
        raise ReplayError(f"bag {path} has no {TOPIC_OBJECTS} messages")
    for k, s in enumerate(steps):
        s.index = k
        if not any(t == TOPIC_ODOM for t, _, _ in s.messages):
            raise ReplayError(f"bag {path}: no {TOPIC_ODOM} at log time {s.stamp_ns} (step {k})")
    stamps = np.array([s.stamp_ns for s in steps], dtype=np.int64)
    scene = LoggedScene(
        stamps_ns=stamps,
        ego=np.array([odom[t][:3] for t in stamps]),
        ego_speed=np.array([odom[t][3] for t in stamps]),
        agents=[objects[t] for t in stamps],
    )
    if max_steps is not None:
        steps = steps[:max_steps]
    return steps, scene, meta


@dataclass
class Cycle:
    """One planner output matched to the step it planned from."""

    step: int
    stamp_ns: int
    candidates: np.ndarray  # [M, T, 2] ego frame at the step
    scores: np.ndarray  # [M]
    selected: int  # -1 = fallback
    plan_dt: float
    wall_latency_ms: float | None  # input published -> candidates received


def _meta_float(meta: dict, key: str, default: float | None = None) -> float | None:
    try:
        return float(meta[key])
    except (KeyError, TypeError, ValueError):
        return default


def clip_from_metadata(meta: dict, scene: LoggedScene, log_dt: float,
                       tol_m: float = 0.05) -> tuple[Any | None, int, str]:
    """The clip the bag was made from (``rad2.map_file`` + ``rad2.clip_id``), the clip step of bag step 0
    (``rad2.first_step``) and a note; ``(None, 0, why)`` when it cannot be loaded or does not match the
    bag's odometry (then the bag itself is the log, see :func:`clip_from_bag`)."""
    map_file, clip_id = meta.get("map_file"), str(meta.get("clip_id") or "first")
    if not map_file:
        return None, 0, "bag metadata names no rad2.map_file"
    path = Path(map_file)
    try:
        if path.is_dir():
            src = load_clip_source(str(path), None if clip_id in ("", "first") else clip_id, None, None)
        else:
            src = load_clip_source(None, None, None, str(path))
    except Exception as exc:  # noqa: BLE001 - any load failure falls back to the bag
        return None, 0, f"clip {clip_id!r} of {map_file} not loadable ({exc})"
    clip = src.clip
    first = int(_meta_float(meta, "first_step", 0.0) or 0)
    if abs(float(clip.dt) - log_dt) > 1e-6:
        return None, 0, f"clip dt {clip.dt} differs from the bag's {log_dt}"
    n = len(scene.stamps_ns)
    if first < 0 or first + n > clip.num_steps:
        return None, 0, f"bag steps {first}..{first + n} exceed clip {clip.clip_id} ({clip.num_steps} steps)"
    idx = first + np.arange(n)
    err = np.hypot(clip.ego_x[idx] - scene.ego[:, 0], clip.ego_y[idx] - scene.ego[:, 1]).max()
    if err > tol_m:
        return None, 0, f"clip {clip.clip_id} ego differs from the bag odometry by {err:.2f} m"
    return clip, first, f"clip {clip.clip_id} of {map_file} (bag step 0 = clip step {first})"


def clip_from_bag(scene: LoggedScene, log_dt: float, meta: dict, vehicle: dict[str, Any]) -> Any:
    """A clip-like log (the fields rad2_core.open_loop_metrics.logged_future reads) built from the bag's
    odometry and object lists; agents are matched across steps by id. The ego box is the bag's, else
    ``vehicle``'s (the ``vehicle`` block of params/vehicle.yaml)."""
    from types import SimpleNamespace

    n_steps = len(scene.stamps_ns)
    ids = sorted({int(i) for a in scene.agents for i in a["ids"]})
    col = {i: k for k, i in enumerate(ids)}
    shape = (len(ids), n_steps)
    tracks = {k: np.zeros(shape) for k in ("x", "y", "yaw", "vx", "vy")}
    valid = np.zeros(shape, bool)
    length, width = np.zeros(len(ids)), np.zeros(len(ids))
    for t, a in enumerate(scene.agents):
        rows = np.array([col[int(i)] for i in a["ids"]], dtype=np.int64)
        if not len(rows):
            continue
        for k in tracks:
            tracks[k][rows, t] = a[k]
        valid[rows, t] = True
        length[rows], width[rows] = a["length"], a["width"]
    ego_length = _meta_float(meta, "ego_length", vehicle["length"])
    ego_width = _meta_float(meta, "ego_width", vehicle["width"])
    return SimpleNamespace(
        clip_id="bag", dt=log_dt, num_steps=n_steps,
        ego_x=scene.ego[:, 0], ego_y=scene.ego[:, 1], ego_yaw=scene.ego[:, 2],
        ego_length=ego_length, ego_width=ego_width,
        agent_ids=np.array(ids, dtype=np.int64), agent_length=length, agent_width=width,
        agent_x=tracks["x"], agent_y=tracks["y"], agent_yaw=tracks["yaw"],
        agent_vx=tracks["vx"], agent_vy=tracks["vy"], agent_valid=valid,
    )


class DrivableRaster:
    """The BEV drivable-area channel at a world pose (params/bev.yaml geometry) for the offroad metric."""

    def __init__(self, clip: Any, params: dict[str, Any]):
        from rad2_core import bev

        params = {**params, "bev": {**params["bev"], "channels": ["drivable_area"], "vector_channels": []}}
        self.params, self.bev, self.clip = params, bev, clip
        self.cfg = bev.BevConfig.from_params(params)
        self.prepared = bev.prepare_map(clip.map)
        self.origin = (self.cfg.origin_x, self.cfg.origin_y)
        self.resolution = self.cfg.resolution

    def __call__(self, pose: np.ndarray) -> np.ndarray:
        snap = self.bev.SceneSnapshot(map=self.clip.map, ego_pose=np.asarray(pose, np.float64),
                                      route_polyline=self.clip.route_polyline,
                                      agents=self.bev.AgentFrame.empty(),
                                      ego_length=self.clip.ego_length, ego_width=self.clip.ego_width)
        return self.bev.rasterize_bev(snap, params=self.params, prepared=self.prepared)[0]


def open_loop_summary(cycles: list[Cycle], scene: LoggedScene, log_dt: float, meta: dict,
                      params: dict[str, Any]) -> dict[str, Any]:
    """Open-loop metrics of the plans against the log (rad2_core.open_loop_metrics); ``params``:
    params/bev.yaml, sim.yaml and vehicle.yaml as loaded, merged."""
    usable = [c for c in cycles if c.candidates.ndim == 3 and c.candidates.shape[0] > 0]
    out: dict[str, Any] = {"cycles": len(cycles), "cycles_with_candidates": len(usable),
                           "fallback_cycles": sum(c.selected < 0 for c in cycles)}
    if not usable:
        return out
    try:
        from rad2_core import open_loop_metrics as olm
    except ImportError as exc:
        out["error"] = f"rad2_core.open_loop_metrics is not available ({exc})"
        return out
    out.update(_call_open_loop_metrics(olm, usable, scene, log_dt, meta, params))
    return out


def _call_open_loop_metrics(olm: Any, cycles: list[Cycle], scene: LoggedScene, log_dt: float,
                            meta: dict, params: dict[str, Any]) -> dict[str, Any]:
    """Score each cycle's candidates (ego frame of its step) against the logged future.

    The log is the clip named by the bag metadata when it loads and matches the bag's odometry (its
    future reaches past the bag's last step, and it gives the map for the offroad check); otherwise the
    bag's own odometry and object lists. Fallback cycles (selected < 0) count only in ``fallback_cycles``.
    """
    clip, first, note = clip_from_metadata(meta, scene, log_dt)
    source = "clip"
    if clip is None:
        clip, first, source = clip_from_bag(scene, log_dt, meta, params["vehicle"]), 0, "bag"
        note = f"bag odometry and objects ({note})"
    drivable = None
    if source == "clip":
        try:
            drivable = DrivableRaster(clip, params)
        except Exception as exc:  # noqa: BLE001 - offroad is optional
            note += f"; no offroad check ({exc})"
    acc = olm.OpenLoopAccumulator.from_params(params, params)
    per_step: list[dict[str, float]] = []
    full = 0
    for c in cycles:
        if c.selected < 0 or c.selected >= len(c.candidates) or not np.isfinite(c.plan_dt):
            continue
        t = first + c.step
        fut = olm.logged_future(clip, t, c.plan_dt, c.candidates.shape[1])
        if drivable is not None:
            row = acc.add(c.candidates, c.selected, fut, drivable(clip.ego_pose(t)), drivable.origin,
                          drivable.resolution)
        else:
            row = acc.add(c.candidates, c.selected, fut)
        if row:
            full += bool(fut.ego_valid.all())
            per_step.append({"step": c.step, **row})
    return {**acc.summary(), "samples_full_horizon": full, "future_source": source,
            "future_note": note, "per_step": per_step}


# --------------------------------------------------------------------------------------------------
# Report: table and plots (matplotlib / rich imported when called)
# --------------------------------------------------------------------------------------------------

#: Summary keys of OpenLoopAccumulator shown in the table, with units.
METRIC_LABELS = {
    "ADE": ("ADE selected", "m"), "FDE": ("FDE selected", "m"),
    "minADE": ("minADE (best of M)", "m"), "minFDE": ("minFDE (best of M)", "m"),
    "CR": ("CR collision rate", "%"), "DCR": ("DCR dynamic", "%"), "SCR": ("SCR static", "%"),
    "coll_any": ("candidates colliding", "%"), "offroad": ("offroad (selected)", "%"),
}


def plot_plans(cycles: list[Cycle], scene: LoggedScene, png: Path, title: str, every: int = 5) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from rad2_core.geometry import ego_to_world

    fig, ax = plt.subplots(figsize=(9, 7))
    ax.plot(scene.ego[:, 0], scene.ego[:, 1], "k-", lw=2, label="logged ego")
    for c in cycles:
        if c.step % every or c.candidates.ndim != 3 or not len(c.candidates):
            continue
        pose = scene.ego[c.step]
        for cand in c.candidates:
            w = ego_to_world(cand, pose)
            ax.plot(w[:, 0], w[:, 1], color="0.7", lw=0.5, alpha=0.5)
        if c.selected >= 0:
            w = ego_to_world(c.candidates[c.selected], pose)
            ax.plot(w[:, 0], w[:, 1], "-", color="tab:blue", lw=1.5)
        else:
            ax.plot(pose[0], pose[1], "rx")
    ax.plot([], [], color="tab:blue", label=f"selected plan (every {every} steps)")
    ax.plot([], [], color="0.7", label="candidates")
    ax.set_aspect("equal")
    ax.set_xlabel("x (m)")
    ax.set_ylabel("y (m)")
    ax.set_title(title)
    ax.legend(loc="best")
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


def plot_timeline(cycles: list[Cycle], per_step: list[dict[str, float]], png: Path, title: str) -> None:
    """Wall latency per step, and ADE/FDE (selected and best of M) per step with collision marks."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 1, figsize=(10, 6.5), sharex=True)
    steps = [c.step for c in cycles]
    lat = [c.wall_latency_ms if c.wall_latency_ms is not None else np.nan for c in cycles]
    axes[0].plot(steps, lat, ".-", label="input published -> candidates received (wall)")
    axes[0].set_ylabel("ms")
    axes[0].legend(loc="upper right")
    ax = axes[1]
    if per_step:
        x = np.array([r["step"] for r in per_step])
        for key, style in (("ADE", "-"), ("FDE", "-"), ("minADE", "--"), ("minFDE", "--")):
            y = np.array([r.get(key, np.nan) for r in per_step])
            color = "tab:blue" if "ADE" in key else "tab:orange"
            label = f"{key} ({'selected' if key[0] != 'm' else 'best of M'})"
            ax.plot(x, y, style, marker=".", ms=3, color=color, lw=1.2, label=label)
        hit = np.array([r.get("CR", 0.0) > 0 for r in per_step])
        if hit.any():
            y = np.array([r["FDE"] for r in per_step])
            ax.plot(x[hit], y[hit], "rx", ms=7, label="selected plan collides (CR)")
        ax.legend(loc="upper right", fontsize=8, ncol=2)
    else:
        ax.text(0.5, 0.5, "no open-loop metrics", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("log step")
    ax.set_ylabel("displacement error vs logged ego (m)")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


def print_replay_report(report: dict[str, Any], title: str) -> None:
    """The open-loop metric table of a replay report (what ``run_replay`` returns)."""
    from rich.console import Console
    from rich.table import Table

    metrics = report["open_loop"]
    wall = report["wall_latency_ms"]
    table = Table(title=title)
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key, (label, unit) in METRIC_LABELS.items():
        if key in metrics:
            value = metrics[key]
            table.add_row(f"{label} ({unit})", f"{value:.2f}" if unit == "%" else f"{value:.3f}")
    if "samples" in metrics:
        table.add_row("scored plans (with full horizon)",
                      f"{int(metrics['samples'])} ({metrics['samples_full_horizon']})")
        table.add_row("logged future from", str(metrics["future_source"]))
    if "error" in metrics:
        table.add_row("error", str(metrics["error"]))
    table.add_row("fallback cycles", str(metrics.get("fallback_cycles", 0)))
    table.add_row("steps / plans received", f"{report['steps']} / {report['plans_received']}")
    table.add_row("wall latency p50 / p90 / p99 (ms)",
                  " / ".join(f"{wall[q]:.1f}" for q in ("p50", "p90", "p99")))
    table.add_row("replay speed (steps/s)", f"{report['steps_per_s']:.1f}")
    Console().print(table)
