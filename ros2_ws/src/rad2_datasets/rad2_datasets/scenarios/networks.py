"""SUMO road networks for scenario generation, built with SUMO's own tools, and their lane maps.

Four network kinds: ``grid`` (signalised grid, netgenerate --grid), ``highway`` (multi-lane
motorway with on-ramps and acceleration lanes, plain node/edge XML through netconvert), ``spider``
(radial/ring roads, netgenerate --spider) and ``random`` (netgenerate --rand, one map per seed).
Built networks are cached under a directory keyed by a hash of their parameters.

:func:`read_lane_geometry` turns a ``.net.xml`` into plain arrays (lane centerlines, boundaries,
speed limits, successors incl. internal junction lanes, drivable polygons) that ``clip.LaneMap``
is built from.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from rad2_core.tokens import clean_polyline

NETWORK_KINDS = ("grid", "highway", "spider", "random")


class NetworkBuildError(RuntimeError):
    """netgenerate/netconvert failed or produced an unusable network."""


def sumo_binary(name: str) -> str:
    """Path of a SUMO executable (netgenerate, netconvert, sumo) from the eclipse-sumo package."""
    try:
        import sumo  # the eclipse-sumo wheel

        home = Path(sumo.SUMO_HOME)
    except ImportError:
        home = Path(os.environ.get("SUMO_HOME", ""))
    path = home / "bin" / name
    if not path.is_file():
        raise NetworkBuildError(f"SUMO binary {name!r} not found under {home}/bin (pip install eclipse-sumo)")
    return str(path)


@dataclass(frozen=True)
class NetworkSpec:
    kind: str  # one of NETWORK_KINDS
    variant: int  # distinguishes several maps of one kind (random: netgenerate seed)
    params: dict  # the kind's block of scenarios.networks

    @property
    def name(self) -> str:
        base = f"{self.kind}{self.variant}" if self.kind == "random" else self.kind
        width = self.params.get("lane_width_m")
        return base if width is None else f"{base}_w{float(width):.2f}".replace(".", "p")

    def digest(self) -> str:
        blob = json.dumps({"kind": self.kind, "variant": self.variant, "params": self.params}, sort_keys=True)
        return hashlib.sha1(blob.encode()).hexdigest()[:12]


def network_specs(
    net_params: dict[str, Any],
    kind: str,
    lane_width_m: float | None = None,
    sidewalk_width_m: float | None = None,
) -> list[NetworkSpec]:
    """All maps of one network kind (random has one per configured seed). ``lane_width_m`` builds them
    with that lane width and, ``sidewalk_width_m`` given, with sidewalks and pedestrian crossings (not
    on the motorway); both None is the network of the committed sets (SUMO's default width)."""
    if kind not in NETWORK_KINDS:
        raise ValueError(f"network kind {kind!r} is not one of {NETWORK_KINDS}")
    if kind not in net_params:
        raise ValueError(f"scenarios.networks has no block for {kind!r}")
    p = dict(net_params[kind])
    if lane_width_m is not None:
        p["lane_width_m"] = float(lane_width_m)
        if sidewalk_width_m is not None and kind != "highway":
            p["sidewalk_width_m"] = float(sidewalk_width_m)
    if kind == "random":
        variants = [int(v) for v in p.pop("variants")]
        if not variants:
            raise ValueError("scenarios.networks.random.variants is empty")
        return [NetworkSpec(kind, v, dict(p)) for v in variants]
    return [NetworkSpec(kind, 0, p)]


def _run(cmd: list[str], cwd: Path) -> None:
    res = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if res.returncode != 0:
        raise NetworkBuildError(f"{Path(cmd[0]).name} failed ({res.returncode}): {res.stderr.strip()[-800:]}")


_COMMON_NET_OPTS = ["--no-turnarounds", "true", "--offset.disable-normalization", "true"]


def _run_net_tool(tool: str, args: list[str], out: Path, work: Path) -> None:
    """netgenerate / netconvert with ``args`` plus the options every network shares, writing ``out``."""
    _run([sumo_binary(tool), *args, *_COMMON_NET_OPTS, "-o", str(out)], work)


def _lane_defaults(p: dict, junction_type: bool = True) -> list[str]:
    """netgenerate's default lane count and speed (and junction type) from a network block."""
    opts = ["--default.lanenumber", str(int(p["lanes"])), "--default.speed", str(float(p["speed_mps"]))]
    if "lane_width_m" in p:
        opts += ["--default.lanewidth", str(float(p["lane_width_m"]))]
    if "sidewalk_width_m" in p:
        opts += ["--sidewalks.guess", "true", "--crossings.guess", "true",
                 "--default.sidewalk-width", str(float(p["sidewalk_width_m"]))]
    if junction_type:
        opts += ["--default-junction-type", str(p["junction_type"])]
    return opts


def _build_grid(p: dict, out: Path, work: Path) -> None:
    length = str(float(p["street_length_m"]))
    args = ["--grid", "--grid.number", str(int(p["junctions"])), "--grid.length", length,
            "--grid.attach-length", length]
    _run_net_tool("netgenerate", args + _lane_defaults(p), out, work)


def _build_spider(p: dict, out: Path, work: Path) -> None:
    radius = str(float(p["radius_m"]))
    args = ["--spider", "--spider.arm-number", str(int(p["arms"])), "--spider.circle-number",
            str(int(p["circles"])), "--spider.space-radius", radius, "--spider.omit-center",
            "--spider.attach-length", radius]
    _run_net_tool("netgenerate", args + _lane_defaults(p), out, work)


def _build_random(p: dict, seed: int, out: Path, work: Path) -> None:
    args = ["--rand", "--seed", str(int(seed)), "--rand.iterations", str(int(p["iterations"])),
            "--rand.min-distance", str(float(p["min_distance_m"])), "--rand.max-distance",
            str(float(p["max_distance_m"])), "--rand.min-angle", "60", "--tls.guess", "true"]
    _run_net_tool("netgenerate", args + _lane_defaults(p, junction_type=False), out, work)


def _build_highway(p: dict, out: Path, work: Path) -> None:
    """Straight one-way motorway: main / merge(+1 acceleration lane) / main / merge / main, two on-ramps."""
    segs = [float(s) for s in p["segment_lengths_m"]]
    if len(segs) != 5 or min(segs) <= 0:
        raise ValueError(
            f"scenarios.networks.highway.segment_lengths_m must be 5 positive lengths, got {segs}"
        )
    lanes, speed = int(p["lanes"]), float(p["speed_mps"])
    width = f' width="{float(p["lane_width_m"])}"' if "lane_width_m" in p else ""
    ramp_len, ramp_lat, ramp_speed = (
        float(p["ramp_length_m"]),
        float(p["ramp_lateral_m"]),
        float(p["ramp_speed_mps"]),
    )
    xs = np.concatenate([[0.0], np.cumsum(segs)])
    nodes = [f'<node id="m{i}" x="{x:.2f}" y="0" type="priority"/>' for i, x in enumerate(xs)]
    edges = []
    for i in range(5):
        n = lanes + 1 if i in (1, 3) else lanes
        edges.append(f'<edge id="main{i}" from="m{i}" to="m{i + 1}" numLanes="{n}" speed="{speed}"{width}/>')
    for k, merge_start in enumerate((1, 3)):
        x0 = xs[merge_start]
        dx = np.sqrt(max(ramp_len**2 - ramp_lat**2, 1.0))
        nodes.append(f'<node id="r{k}" x="{x0 - dx:.2f}" y="{-ramp_lat:.2f}" type="priority"/>')
        edges.append(
            f'<edge id="ramp{k}" from="r{k}" to="m{merge_start}" numLanes="1" speed="{ramp_speed}"{width}/>'
        )
    # explicit lane mapping: main lanes shift one up at a merge, the ramp feeds the acceleration lane 0
    cons = []
    for k, m in enumerate((1, 3)):
        for lane in range(lanes):
            cons.append(
                f'<connection from="main{m - 1}" to="main{m}" fromLane="{lane}" toLane="{lane + 1}"/>'
            )
        cons.append(f'<connection from="ramp{k}" to="main{m}" fromLane="0" toLane="0"/>')
        for lane in range(lanes):
            cons.append(
                f'<connection from="main{m}" to="main{m + 1}" fromLane="{lane + 1}" toLane="{lane}"/>'
            )
    nod, edg, con = work / "hw.nod.xml", work / "hw.edg.xml", work / "hw.con.xml"
    nod.write_text("<nodes>\n" + "\n".join(nodes) + "\n</nodes>\n")
    edg.write_text("<edges>\n" + "\n".join(edges) + "\n</edges>\n")
    con.write_text("<connections>\n" + "\n".join(cons) + "\n</connections>\n")
    args = ["--node-files", str(nod), "--edge-files", str(edg), "--connection-files", str(con)]
    _run_net_tool("netconvert", args, out, work)


def build_network(spec: NetworkSpec, cache_dir: str | os.PathLike) -> Path:
    """Build (or reuse from the cache) the network; returns the ``.net.xml`` path."""
    cache = Path(cache_dir) / f"{spec.name}_{spec.digest()}"
    out = cache / f"{spec.name}.net.xml"
    if out.is_file():
        return out
    cache.mkdir(parents=True, exist_ok=True)
    tmp = cache / f".{os.getpid()}.net.xml"
    if spec.kind == "grid":
        _build_grid(spec.params, tmp, cache)
    elif spec.kind == "highway":
        _build_highway(spec.params, tmp, cache)
    elif spec.kind == "spider":
        _build_spider(spec.params, tmp, cache)
    elif spec.kind == "random":
        _build_random(spec.params, spec.variant, tmp, cache)
    else:
        raise ValueError(f"network kind {spec.kind!r} is not one of {NETWORK_KINDS}")
    os.replace(tmp, out)  # atomic: concurrent workers may build the same network
    return out


# ----------------------------------------------------------------------------------------------
# lane geometry


def offset_polyline(points: np.ndarray, offset: float) -> np.ndarray:
    """Offset a polyline sideways by ``offset`` (positive = to the left of its direction).

    Vertex normals are the normalised sum of the adjacent segment normals, scaled so that the
    offset segments stay parallel to the originals (mitre join, clamped for sharp corners).
    """
    pts = np.asarray(points, dtype=np.float64)
    if pts.ndim != 2 or pts.shape[1] != 2 or len(pts) < 2:
        raise ValueError(f"offset_polyline: points must be [P>=2, 2], got shape {pts.shape}")
    seg = np.diff(pts, axis=0)
    seg_len = np.linalg.norm(seg, axis=1, keepdims=True)
    seg_dir = seg / np.maximum(seg_len, 1e-9)
    seg_n = np.stack([-seg_dir[:, 1], seg_dir[:, 0]], axis=1)
    normals = np.empty_like(pts)
    normals[0], normals[-1] = seg_n[0], seg_n[-1]
    if len(pts) > 2:
        summed = seg_n[:-1] + seg_n[1:]
        norm = np.linalg.norm(summed, axis=1, keepdims=True)
        unit = np.where(norm > 1e-9, summed / np.maximum(norm, 1e-9), seg_n[1:])
        cos_half = np.clip(np.sum(unit * seg_n[1:], axis=1, keepdims=True), 0.5, 1.0)
        normals[1:-1] = unit / cos_half
    return pts + offset * normals


def _clean_shape(shape) -> np.ndarray:
    return clean_polyline(np.asarray(shape, dtype=np.float64)[:, :2], 1e-3, pad=1e-2)


def _lane_outline(lane) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A sumolib lane's centreline and its left and right boundaries (half the lane width aside)."""
    c = _clean_shape(lane.getShape())
    half = lane.getWidth() / 2.0
    return c, offset_polyline(c, half), offset_polyline(c, -half)


@dataclass
class LaneGeometry:
    """A network's lanes as arrays (the fields of clip.LaneMap plus SUMO ids for lookup)."""

    sumo_lane_ids: list[str]
    lane_ids: np.ndarray  # [L] int64, index into sumo_lane_ids
    centerlines: list[np.ndarray]
    left_boundaries: list[np.ndarray]
    right_boundaries: list[np.ndarray]
    speed_limits: np.ndarray  # [L] m/s
    successors: list[list[int]]
    drivable_areas: list[np.ndarray]
    crosswalks: list[np.ndarray]
    sumo_lengths: np.ndarray  # [L] SUMO's lane length (lane positions are measured in it)

    def index(self) -> dict[str, int]:
        return {s: i for i, s in enumerate(self.sumo_lane_ids)}


def read_lane_geometry(net_file: str | os.PathLike, net=None) -> LaneGeometry:
    """Lane-level map of a SUMO network, incl. internal (junction) lanes so routes are continuous."""
    import sumolib

    if net is None:
        net = sumolib.net.readNet(str(net_file), withInternal=True)
    lanes = []
    for edge in net.getEdges(withInternal=True):
        if edge.getFunction() in ("walkingarea", "crossing"):
            continue
        for lane in edge.getLanes():
            if lane.allows("passenger"):
                lanes.append(lane)
    lanes.sort(key=lambda ln: ln.getID())
    ids = [ln.getID() for ln in lanes]
    idx = {s: i for i, s in enumerate(ids)}
    centers, lefts, rights, speeds, succs, polys, lengths = [], [], [], [], [], [], []
    for lane in lanes:
        c, left, right = _lane_outline(lane)
        centers.append(c)
        lefts.append(left)
        rights.append(right)
        polys.append(np.vstack([left, right[::-1]]))
        speeds.append(lane.getSpeed())
        lengths.append(lane.getLength())
        nxt = []
        for conn in lane.getOutgoing():
            via = conn.getViaLaneID()
            target = via if via else conn.getToLane().getID()
            if target in idx and idx[target] not in nxt:
                nxt.append(idx[target])
        succs.append(nxt)
    for node in net.getNodes():
        shape = node.getShape()
        if shape is not None and len(shape) >= 3:
            polys.append(np.asarray(shape, dtype=np.float64)[:, :2])
    crosswalks = []
    for edge in net.getEdges(withInternal=True):
        if edge.getFunction() == "crossing":
            for lane in edge.getLanes():
                _, left, right = _lane_outline(lane)
                crosswalks.append(np.vstack([left, right[::-1]]))
    return LaneGeometry(
        sumo_lane_ids=ids,
        lane_ids=np.arange(len(ids), dtype=np.int64),
        centerlines=centers,
        left_boundaries=lefts,
        right_boundaries=rights,
        speed_limits=np.asarray(speeds, dtype=np.float64),
        successors=succs,
        drivable_areas=polys,
        crosswalks=crosswalks,
        sumo_lengths=np.asarray(lengths, dtype=np.float64),
    )
