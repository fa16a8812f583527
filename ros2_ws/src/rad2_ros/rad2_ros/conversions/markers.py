"""The candidate set as RViz / Foxglove markers (``planning/markers``): one line strip per candidate,
coloured by score, the selected one blue and wider.

The serialized form the planner publishes is :func:`rad2_ros.conversions.cdr.candidate_markers_to_cdr`.
"""

from __future__ import annotations

import math

import numpy as np
from geometry_msgs.msg import Point
from std_msgs.msg import ColorRGBA
from visualization_msgs.msg import Marker, MarkerArray

from rad2_ros.conversions.common import EGO_FRAME, as_array, fail, make_header

#: height of the candidate lines above the ground (m), so that they draw over a ground plane
MARKER_Z = 0.1
_SELECTED_RGBA = (0.1, 0.4, 1.0, 1.0)
_UNSCORED_RGBA = (0.6, 0.6, 0.6, 0.6)


def _candidate_marker_styles(scores: np.ndarray, selected: int) -> list[tuple[str, float, tuple]]:
    """(namespace, line width in m, RGBA) of each candidate's line: scored red (0) to green (1), grey
    when unscored (NaN), the selected one blue and wider."""
    out = []
    for m, score in enumerate(np.asarray(scores, dtype=np.float64)):
        if m == selected:
            out.append(("selected", 0.4, _SELECTED_RGBA))
        elif not math.isfinite(score):
            out.append(("candidates", 0.1, _UNSCORED_RGBA))
        else:
            v = float(np.clip(score, 0.0, 1.0))
            out.append(("candidates", 0.1, (1.0 - v, v, 0.1, 0.8)))
    return out


def marker_fields(candidates, scores, selected) -> tuple[np.ndarray, list[tuple[str, float, tuple]]]:
    kind = "MarkerArray"
    cands = as_array(kind, "candidates", candidates, (None, None, 2), np.float64)
    score_arr = np.asarray(scores, dtype=np.float64)
    if score_arr.shape != (cands.shape[0],):
        raise fail(kind, "scores", f"has shape {list(score_arr.shape)}, expected [{cands.shape[0]}]")
    return cands, _candidate_marker_styles(score_arr, int(selected))


def candidate_markers_to_msg(candidates: np.ndarray, scores: np.ndarray, selected: int, stamp_ns: int,
                             frame_id: str = EGO_FRAME) -> MarkerArray:
    """A DELETEALL marker, then one LINE_STRIP per candidate from the ego (the origin) through its points."""
    cands, styles = marker_fields(candidates, scores, selected)
    out = MarkerArray()
    clear = Marker(action=Marker.DELETEALL)
    clear.header = make_header(stamp_ns, frame_id)
    out.markers.append(clear)
    for m, (traj, (ns, width, rgba)) in enumerate(zip(cands, styles)):
        mk = Marker()
        mk.header = make_header(stamp_ns, frame_id)
        mk.ns, mk.id = ns, m
        mk.type, mk.action = Marker.LINE_STRIP, Marker.ADD
        mk.pose.orientation.w = 1.0
        mk.scale.x = width
        mk.color = ColorRGBA(r=rgba[0], g=rgba[1], b=rgba[2], a=rgba[3])
        mk.points = [Point(x=0.0, y=0.0, z=MARKER_Z)] + [Point(x=float(x), y=float(y), z=MARKER_Z)
                                                         for x, y in traj]
        out.markers.append(mk)
    return out
