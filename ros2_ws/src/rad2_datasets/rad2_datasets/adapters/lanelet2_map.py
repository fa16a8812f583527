"""Lanelet2 maps (OSM XML, the format of Autoware and the Lanelet2 tools) -> :class:`LaneMap`.

Read with the ``lanelet2`` package (``pip install lanelet2``); the lane relations come from its
routing graph built with the German traffic rules for vehicles (``lanelet2.traffic_rules``, the
rule set the package ships).

What becomes what:

- **lanes**: every lanelet a vehicle may drive on (``TrafficRules.canPass``), lane id = lanelet id;
  a lanelet drivable both ways (``one_way=no``) also gives its reverse direction as lane ``-id - 1``.
  Centreline, left and right bound are the lanelet's (in the lane's direction of travel).
  Pedestrian lanelets (crosswalks, walkways) are no lanes.
- **successors**: the routing graph's ``following`` (no lane changes).
- **neighbours**: the routing graph's ``left``/``right`` (a lane change is allowed there, e.g. a
  dashed marking) or else ``adjacentLeft``/``adjacentRight`` (a neighbour without permission, e.g. a
  solid marking); ``lane_change_left/right`` tell which.
- **speed limits**: the traffic rules' ``speedLimit`` (the lanelet's ``speed_limit`` tag, speed-limit
  regulatory elements, or the default of its ``location``); ``adapters.default_speed_limits.default``
  (params/bev.yaml) where they give none.
- **drivable areas**: each lanelet's polygon; **crosswalks**: lanelets with ``subtype=crosswalk``.
- **traffic signals**: every ``TrafficLight`` regulatory element referenced by a lane: signal id =
  the element's id, controlled lanes = the lanes of the lanelets that reference it, stop line = its
  ``ref_line`` (stop line); without one, a line across each controlled lane at the light's
  position projected onto the lane (which clamps to the lane's end, where traffic stops).
  Lights referenced by no lane (e.g. pedestrian lights on crosswalks) are left out.

Coordinates (``projector``): ``"local"`` projects lat/lon onto a local tangent plane at ``origin``
(x east, y north); ``"utm"`` uses UTM, offset so that ``origin`` is at (0, 0) (the grid is rotated
slightly against true north away from the central meridian); ``"local_xy"`` takes the metres in the
nodes' ``local_x``/``local_y`` tags (Autoware maps, whose localisation runs in that frame);
``"auto"`` (default) takes ``local_xy`` when every node has both tags, else ``local``. ``origin``
(lat, lon) defaults to the file's first node (``local_xy`` coordinates do not depend on it).

Errors are :class:`Lanelet2MapError` naming the file, the element (``lanelet 1234``, ``regulatory
element 77``...) and the field or value at fault.
"""

from __future__ import annotations

import math
import os
import re
import xml.etree.ElementTree as ET
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from rad2_core.config import require
from rad2_core.lane_map import NO_LANE, LaneMap
from rad2_core.tokens import arc_lengths, clean_polyline, project_onto_polyline

from rad2_datasets.adapters import lane_match_costs, route_polyline

try:
    import lanelet2  # noqa: F401  (registers the submodules below)
    from lanelet2 import core, io, projection, routing, traffic_rules
except ImportError as _exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "rad2_datasets.adapters.lanelet2_map needs the lanelet2 package (pinned in tools/requirements.txt: "
        "pip install lanelet2==1.2.3)"
    ) from _exc

PROJECTORS = ("auto", "local", "utm", "local_xy")
# Nearest bound points closer than this to each other count as one vertex of a computed stop line.
_SAME_POINT_M = 0.05


class Lanelet2MapError(ValueError):
    """A Lanelet2 map file cannot be turned into a LaneMap; the message names file and element."""


@dataclass
class Lanelet2Map:
    """A loaded Lanelet2 map: the LaneMap plus what mission routing needs from lanelet2."""

    lane_map: LaneMap
    path: Path
    origin: tuple[float, float]  # lat, lon in degrees
    projector: str  # the one used: "local", "utm" or "local_xy"
    lanelet_map: Any  # lanelet2.core.LaneletMap
    rules: Any  # lanelet2.traffic_rules.TrafficRules
    graph: Any  # lanelet2.routing.RoutingGraph
    lane_of: dict[tuple[int, bool], int]  # (lanelet id, inverted) -> lane id

    def lane_id(self, lanelet) -> int | None:
        """The lane id of a lanelet2 (Const)Lanelet in its direction, None if it is no lane."""
        return self.lane_of.get((int(lanelet.id), bool(lanelet.inverted())))


@dataclass
class _OsmScan:
    """What the loader needs from the raw XML before lanelet2 parses it."""

    first_node: tuple[int, float, float] | None  # id, lat, lon
    kinds: dict[int, str]  # element id -> "lanelet", "regulatory element", "linestring", "point", ...
    all_local_xy: bool


def _fail(path: Path, where: str, message: str) -> Lanelet2MapError:
    return Lanelet2MapError(f"{path}: {where}: {message}" if where else f"{path}: {message}")


def _scan_osm(path: Path) -> _OsmScan:
    """One streaming pass over the XML: the first node (default origin), the kind of every element
    (to name it in errors; lanelet2 reports only "primitive <id>") and whether all nodes carry
    local_x/local_y."""
    first: tuple[int, float, float] | None = None
    kinds: dict[int, str] = {}
    all_local = True
    nodes = 0
    relation_kinds = {"lanelet": "lanelet", "regulatory_element": "regulatory element",
                      "multipolygon": "area"}
    try:
        for _, el in ET.iterparse(path, events=("end",)):
            if el.tag not in ("node", "way", "relation"):
                continue
            raw_id = el.get("id", "")
            try:
                eid = int(raw_id)
            except ValueError:
                raise _fail(path, f"{el.tag} {raw_id!r}", "id is not an integer") from None
            tags = {t.get("k"): t.get("v") for t in el.findall("tag")}
            if el.tag == "node":
                nodes += 1
                kinds.setdefault(eid, "point")
                all_local = all_local and "local_x" in tags and "local_y" in tags
                if first is None:
                    lat, lon = (_float_attr(path, f"node {eid}", el, k) for k in ("lat", "lon"))
                    first = (eid, lat, lon)
            elif el.tag == "way":
                kinds[eid] = "polygon" if tags.get("area") == "yes" else "linestring"
            else:
                kinds[eid] = relation_kinds.get(tags.get("type", ""), "relation")
            el.clear()
    except ET.ParseError as exc:
        raise _fail(path, "", f"not a readable OSM XML file ({exc})") from exc
    except OSError as exc:
        raise _fail(path, "", f"cannot be read ({exc})") from exc
    return _OsmScan(first, kinds, all_local and nodes > 0)


def _float_attr(path: Path, where: str, el, key: str) -> float:
    raw = el.get(key)
    try:
        value = float(raw)
    except (TypeError, ValueError):
        raise _fail(path, where, f"{key} {raw!r} is not a number") from None
    if not math.isfinite(value):
        raise _fail(path, where, f"{key} {raw!r} is not finite")
    return value


_PRIMITIVE = re.compile(r"primitive (?:with id )?(-?\d+)(?: from file)?: (.*)")


def _parser_errors(path: Path, errors: list[str], kinds: dict[int, str]) -> Lanelet2MapError:
    """lanelet2's parser messages grouped by element and named like the rest of this module."""
    by_element: dict[int, list[str]] = defaultdict(list)
    other: list[str] = []
    for line in errors:
        line = line.strip().lstrip("- ").strip()
        m = _PRIMITIVE.search(line)
        if m:
            by_element[int(m.group(1))].append(m.group(2).rstrip("!. "))
        elif line and not line.startswith("Errors ocurred"):
            other.append(line)
    parts = [f"{kinds.get(eid, 'element')} {eid}: {'; '.join(msgs)}" for eid, msgs in by_element.items()]
    return Lanelet2MapError(f"{path}: " + " | ".join(parts + other))


def _projector(path: Path, name: str, origin: tuple[float, float]):
    lat, lon = origin
    if not (math.isfinite(lat) and -90.0 <= lat <= 90.0):
        raise _fail(path, "origin", f"lat {lat} is outside [-90, 90]")
    if not (math.isfinite(lon) and -180.0 <= lon <= 180.0):
        raise _fail(path, "origin", f"lon {lon} is outside [-180, 180]")
    o = io.Origin(float(lat), float(lon))
    try:
        return projection.UtmProjector(o) if name == "utm" else projection.LocalCartesianProjector(o)
    except RuntimeError as exc:
        raise _fail(path, "origin", f"({lat}, {lon}) cannot be projected with {name}: {exc}") from exc


def _use_local_xy(path: Path, lanelet_map) -> None:
    """Move every point to the metres of its local_x/local_y tags (the lat/lon projection is
    replaced, so the map lives in the frame the vehicle's localisation uses)."""
    for pt in lanelet_map.pointLayer:
        attrs = pt.attributes
        xy = []
        for key in ("local_x", "local_y"):
            raw = attrs[key] if key in attrs else None
            try:
                value = float(raw)
            except (TypeError, ValueError):
                raise _fail(path, f"point {pt.id}", f"{key} {raw!r} is not a number") from None
            if not math.isfinite(value):
                raise _fail(path, f"point {pt.id}", f"{key} {raw!r} is not finite")
            xy.append(value)
        pt.x, pt.y = xy
    for ll in lanelet_map.laneletLayer:
        ll.resetCache()  # centrelines are cached from the old coordinates otherwise


def _xy(linestring) -> np.ndarray:
    return np.array([[p.x, p.y] for p in linestring], dtype=np.float64).reshape(-1, 2)


def _lane_geometry(path: Path, ll) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    where = f"lanelet {ll.id}" + (" (reverse direction)" if ll.inverted() else "")
    left, right = _xy(ll.leftBound), _xy(ll.rightBound)
    for name, bound, ls in (("left bound", left, ll.leftBound), ("right bound", right, ll.rightBound)):
        if len(bound) < 2:
            raise _fail(path, where, f"{name} {ls.id} has {len(bound)} point(s), needs at least 2")
    center = _xy(ll.centerline)
    for name, pts in (("centerline", center), ("left bound", left), ("right bound", right)):
        if not np.all(np.isfinite(pts)):
            raise _fail(path, where, f"{name} has non-finite coordinates (projection failed?)")
    center = clean_polyline(center, 1e-6)
    if len(center) < 2:
        raise _fail(path, where, "centerline has zero length (left and right bounds collapse to one point)")
    return center, left, right


def _speed_limit(path: Path, rules, ll, fallback: float) -> float:
    try:
        v = float(rules.speedLimit(ll).speedLimitMPS)
    except RuntimeError as exc:
        raise _fail(path, f"lanelet {ll.id}", f"speed limit cannot be read: {exc}") from exc
    if math.isfinite(v) and v > 0.0:
        return v
    attrs = ll.attributes
    if "speed_limit" in attrs:
        # lanelet2 reads an unparsable tag as 0 km/h; a silent fallback would hide a map error
        raise _fail(path, f"lanelet {ll.id}", f"speed_limit {attrs['speed_limit']!r} is not a speed "
                                              "(expected e.g. '50' or '50 km/h')")
    return fallback


def _polyline_point(poly: np.ndarray, s: float) -> np.ndarray:
    cum = arc_lengths(poly)
    return np.array([np.interp(s, cum, poly[:, 0]), np.interp(s, cum, poly[:, 1])])


def _nearest_on(poly: np.ndarray, point: np.ndarray) -> np.ndarray:
    s, _ = project_onto_polyline(poly, point)
    return _polyline_point(poly, s)


def _computed_stop_line(path: Path, reg, lanes: list[tuple[np.ndarray, ...]]) -> np.ndarray:
    """A stop line across the controlled lanes where the light projects onto them (clamped to the
    lane ends), ordered from the leftmost to the rightmost bound point."""
    lights = [_xy(ls) for ls in reg.trafficLights]
    lights = [p for p in lights if len(p)]
    if not lights:
        raise _fail(path, f"regulatory element {reg.id}",
                    "traffic light has neither a ref_line (stop line) nor a 'refers' light to place one at")
    light = np.concatenate(lights).mean(axis=0)
    pts = []
    for center, left, right in lanes:
        c = _polyline_point(center, project_onto_polyline(center, light)[0])
        pts += [_nearest_on(left, c), _nearest_on(right, c)]
    center = lanes[0][0]
    s0 = project_onto_polyline(center, light)[0]
    d = _polyline_point(center, s0 + 0.5) - _polyline_point(center, s0 - 0.5)  # direction of travel there
    normal = np.array([-d[1], d[0]]) / max(float(np.linalg.norm(d)), 1e-12)  # points left
    order = np.argsort([-float(p @ normal) for p in pts], kind="stable")
    line = clean_polyline(np.array([pts[i] for i in order]), _SAME_POINT_M)
    if len(line) < 2:
        raise _fail(path, f"regulatory element {reg.id}",
                    "the stop line computed from the light is degenerate")
    return line


def load_lanelet2(
    path: str | os.PathLike,
    origin: tuple[float, float] | None = None,
    projector: str = "auto",
    *,
    params: dict[str, Any],
) -> Lanelet2Map:
    """Load a Lanelet2 .osm map (see the module docstring for the mapping and the projectors;
    ``params``: params/bev.yaml as loaded, for ``adapters.default_speed_limits``)."""
    path = Path(path)
    if projector not in PROJECTORS:
        raise Lanelet2MapError(f"{path}: projector {projector!r} is not one of {list(PROJECTORS)}")
    if not path.is_file():
        raise Lanelet2MapError(f"Lanelet2 map file {path} does not exist")
    fallback_speed = float(require(params, "adapters.default_speed_limits.default"))
    scan = _scan_osm(path)
    if scan.first_node is None:
        raise _fail(path, "", "has no nodes (not a Lanelet2 map)")
    if origin is None:
        origin = (scan.first_node[1], scan.first_node[2])
    origin = (float(origin[0]), float(origin[1]))
    used = projector
    if projector == "auto":
        used = "local_xy" if scan.all_local_xy else "local"
    try:
        lanelet_map, errors = io.loadRobust(str(path), _projector(path, used, origin))
    except RuntimeError as exc:
        raise _fail(path, "", f"lanelet2 cannot parse it: {exc}") from exc
    if errors:
        raise _parser_errors(path, list(errors), scan.kinds)
    if used == "local_xy":
        _use_local_xy(path, lanelet_map)
    rules = traffic_rules.create(traffic_rules.Locations.Germany, traffic_rules.Participants.Vehicle)
    graph = routing.RoutingGraph(lanelet_map, rules)
    return _build(path, origin, used, lanelet_map, rules, graph, fallback_speed)


def _build(path, origin, used, lanelet_map, rules, graph, fallback_speed) -> Lanelet2Map:
    """The LaneMap of a parsed lanelet map (lanes sorted by lanelet id, a reverse lane right after
    its lanelet), validated."""
    lanelets = sorted(lanelet_map.laneletLayer, key=lambda ll: ll.id)
    entries = []  # (ConstLanelet in its driving direction, lane id)
    lane_of: dict[tuple[int, bool], int] = {}
    owner: dict[int, str] = {}
    for ll in lanelets:
        if not rules.canPass(ll):
            continue
        directions = [(ll, int(ll.id))]
        if not rules.isOneWay(ll) and rules.canPass(ll.invert()):
            directions.append((ll.invert(), -int(ll.id) - 1))
        for lanelet, lid in directions:
            name = f"lanelet {ll.id}" + (" (reverse direction)" if lanelet.inverted() else "")
            if lid == NO_LANE:
                raise _fail(path, name, f"lane id {NO_LANE} is reserved for 'no lane' in rad2 maps; "
                                        "renumber the lanelet")
            if lid in owner:
                raise _fail(path, name, f"lane id {lid} is already taken by {owner[lid]}")
            owner[lid] = name
            entries.append((lanelet, lid))
            lane_of[(int(ll.id), bool(lanelet.inverted()))] = lid
    if not entries:
        raise _fail(path, "", f"has no lanelet a vehicle may drive on ({len(lanelets)} lanelets in all)")

    def lane(ll) -> int | None:
        return lane_of.get((int(ll.id), bool(ll.inverted())))

    geometry = [_lane_geometry(path, ll) for ll, _ in entries]
    successors, left_nb, right_nb, lc_left, lc_right, speeds = [], [], [], [], [], []
    for ll, _ in entries:
        successors.append(sorted({v for v in (lane(f) for f in graph.following(ll, False)) if v is not None}))
        for allowed, adjacent, nbs, flags in ((graph.left, graph.adjacentLeft, left_nb, lc_left),
                                              (graph.right, graph.adjacentRight, right_nb, lc_right)):
            nb, ok = allowed(ll), True
            if nb is None:
                nb, ok = adjacent(ll), False
            nb_id = None if nb is None else lane(nb)
            nbs.append(nb_id)
            flags.append(ok and nb_id is not None)
        speeds.append(_speed_limit(path, rules, ll, fallback_speed))
    drivable = [np.concatenate([left, right[::-1]]) for (ll, _), (_, left, right) in zip(entries, geometry)
                if not ll.inverted()]  # a two-way lanelet's area once
    crosswalks = []
    for ll in lanelets:
        attrs = ll.attributes
        if "subtype" in attrs and attrs["subtype"] == "crosswalk":
            left, right = _xy(ll.leftBound), _xy(ll.rightBound)
            poly = np.concatenate([left, right[::-1]])
            if len(poly) < 3 or not np.all(np.isfinite(poly)):
                raise _fail(path, f"lanelet {ll.id}",
                            f"crosswalk polygon has {len(poly)} usable points, needs at least 3")
            crosswalks.append(poly)
    sig_ids, sig_lanes, sig_lines = _signals(path, lanelet_map, entries, geometry, lane_of)
    lane_map = LaneMap.build(
        lane_ids=[lid for _, lid in entries],
        centerlines=[g[0] for g in geometry],
        left_boundaries=[g[1] for g in geometry],
        right_boundaries=[g[2] for g in geometry],
        speed_limits=speeds,
        successors=successors,
        drivable_areas=drivable,
        crosswalks=crosswalks,
        left_neighbors=left_nb,
        right_neighbors=right_nb,
        lane_change_left=lc_left,
        lane_change_right=lc_right,
        signal_ids=sig_ids,
        signal_lanes=sig_lanes,
        signal_stop_lines=sig_lines,
    )
    try:
        lane_map.validate()
    except ValueError as exc:  # a combination the checks above did not foresee: still name the file
        raise _fail(path, "", f"the converted map is inconsistent: {exc}") from exc
    return Lanelet2Map(lane_map, path, origin, used, lanelet_map, rules, graph, lane_of)


def _signals(path, lanelet_map, entries, geometry, lane_of):
    by_lane = {lid: g for (_, lid), g in zip(entries, geometry)}
    ids, lanes, lines = [], [], []
    for reg in sorted(lanelet_map.regulatoryElementLayer, key=lambda r: r.id):
        if not isinstance(reg, core.TrafficLight):
            continue
        # the light governs the direction the lanelet is drawn in (a reverse lane never references it)
        controlled = sorted({lane_of[(int(ll.id), False)] for ll in lanelet_map.laneletLayer.findUsages(reg)
                             if (int(ll.id), False) in lane_of})
        if not controlled:
            continue
        stop = reg.stopLine
        if stop is not None:
            line = _xy(stop)
            if len(line) < 2 or not np.all(np.isfinite(line)):
                raise _fail(path, f"regulatory element {reg.id}",
                            f"stop line (ref_line) {stop.id} has {len(line)} usable point(s), needs 2")
        else:
            line = _computed_stop_line(path, reg, [by_lane[lid] for lid in controlled])
        ids.append(int(reg.id))
        lanes.append(controlled)
        lines.append(line)
    return ids, lanes, lines


def load_lanelet2_map(path: str | os.PathLike, origin: tuple[float, float] | None = None,
                      projector: str = "auto", *, params: dict[str, Any]) -> LaneMap:
    """Just the :class:`LaneMap` of :func:`load_lanelet2`."""
    return load_lanelet2(path, origin, projector, params=params).lane_map


# ----------------------------------------------------------------------------------------------
# mission routes
# ----------------------------------------------------------------------------------------------
def _lane_at(l2: Lanelet2Map, xy, what: str) -> int:
    """Index of the lane whose centreline passes nearest a world position."""
    p = np.asarray(xy, np.float64).reshape(-1)
    if p.shape != (2,) or not np.all(np.isfinite(p)):
        raise _fail(l2.path, "route", f"{what} position {list(p)} is not a finite x, y pair")
    costs = lane_match_costs(l2.lane_map, p[None], np.zeros(1), heading_weight=0.0)[0]
    return int(np.argmin(costs))


def mission_route(
    l2: Lanelet2Map,
    lanelet_ids=None,
    start_xy=None,
    goal_xy=None,
) -> tuple[np.ndarray, np.ndarray]:
    """(route_lane_ids, route_polyline) of a mission on a Lanelet2 map.

    Either ``lanelet_ids`` in driving order (two or more: each consecutive pair is joined by the
    routing graph's shortest path, so a start and a goal lanelet are enough; one: just that lane) or
    ``start_xy`` and ``goal_xy`` (map-frame metres: the lanes nearest them). The path may change
    lanes where the markings allow it; the polyline blends across such changes
    (:func:`rad2_datasets.adapters.route_polyline`).
    """
    lm = l2.lane_map
    if lanelet_ids is not None and len(lanelet_ids):
        wanted = []
        for v in lanelet_ids:
            lid = int(v)
            if (lid, False) not in l2.lane_of:
                raise _fail(l2.path, "route", f"lanelet {lid} is not a lane of the map (unknown or not "
                                              "drivable by a vehicle)")
            wanted.append(l2.lanelet_map.laneletLayer[lid])
    elif start_xy is not None and goal_xy is not None:
        by_lane = {lid: key for key, lid in l2.lane_of.items()}
        wanted = []
        for xy, what in ((start_xy, "start"), (goal_xy, "goal")):
            lanelet_id, inverted = by_lane[int(lm.lane_ids[_lane_at(l2, xy, what)])]
            ll = l2.lanelet_map.laneletLayer[lanelet_id]
            wanted.append(ll.invert() if inverted else ll)
    else:
        raise _fail(l2.path, "route", "give lanelet ids, or a start and a goal position")
    path_lanelets = [wanted[0]]
    for a, b in zip(wanted[:-1], wanted[1:]):
        if a.id == b.id and a.inverted() == b.inverted():
            continue
        sp = l2.graph.shortestPath(a, b, 0, True)
        if sp is None:
            raise _fail(l2.path, "route", f"no route from lanelet {a.id} to lanelet {b.id} for a vehicle "
                                          "(lane changes only where the markings allow them)")
        path_lanelets.extend(list(sp)[1:])
    ids = [l2.lane_id(ll) for ll in path_lanelets]
    if any(v is None for v in ids):  # the graph only holds drivable lanelets, so this is a lanelet2 surprise
        raise _fail(l2.path, "route", "the routing graph's path leaves the map's lanes")
    return np.asarray(ids, np.int64), route_polyline(lm, ids)


__all__ = ["PROJECTORS", "Lanelet2Map", "Lanelet2MapError", "load_lanelet2", "load_lanelet2_map",
           "mission_route"]
