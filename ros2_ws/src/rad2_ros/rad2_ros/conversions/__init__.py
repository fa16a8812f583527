"""The one place where rad2_msgs / standard ROS messages are converted to and from numpy arrays.

Encoders take the arrays the core produces (conventions.md: Observation, planner output) and return
messages; decoders validate a received message before returning arrays and raise
``MessageValidationError`` naming the message type, the field and the offending value or sizes, so a
node can reject the input (and count it) instead of feeding garbage to the planner.
Times are integer nanoseconds (``stamp_ns``) on the numpy side.

One module per message family: :mod:`.odometry`, :mod:`.objects` (agents, perception inputs),
:mod:`.bev`, :mod:`.scene_tokens`, :mod:`.trajectory` (trajectory, candidate set, path),
:mod:`.markers`, :mod:`.control`, :mod:`.diagnostics`; :mod:`.cdr` writes the planner's per-cycle
outputs as bytes straight from the arrays; :mod:`.common` holds the shared checks. This package
re-exports the public names, so callers use ``from rad2_ros import conversions as rc`` and ``rc.<name>``.
"""

from rad2_datasets.bags import time_to_ns

from rad2_ros.conversions.bev import BevFrame, BevGrid, bev_from_msg, bev_to_msg
from rad2_ros.conversions.cdr import (
    candidate_markers_to_cdr,
    candidate_set_to_cdr,
    markers_cdr_matches_this_distro,
    trajectory_to_path_cdr,
)
from rad2_ros.conversions.common import (
    EGO_FRAME,
    WORLD_FRAME,
    MessageValidationError,
    float32_array,
    headings_from_points,
    make_header,
    ns_to_time,
)
from rad2_ros.conversions.control import (
    ControlCommandValues,
    control_command_from_msg,
    control_command_to_msg,
)
from rad2_ros.conversions.diagnostics import planning_diagnostics_from_msg, planning_diagnostics_to_msg
from rad2_ros.conversions.markers import MARKER_Z, candidate_markers_to_msg
from rad2_ros.conversions.objects import (
    AGENT_TYPES,
    SIGNAL_STATES,
    AgentList,
    perception_inputs_from_msg,
    perception_inputs_to_msg,
    perception_signals_from_msg,
)
from rad2_ros.conversions.odometry import EgoMotion, odometry_from_msg, odometry_to_msg
from rad2_ros.conversions.scene_tokens import (
    MAP_POLYLINE_TYPES,
    SceneTokenArrays,
    TokenSizes,
    scene_tokens_from_msg,
    scene_tokens_to_msg,
)
from rad2_ros.conversions.trajectory import (
    CandidateSetArrays,
    TrajectoryArrays,
    candidate_set_from_msg,
    candidate_set_to_msg,
    path_to_trajectory,
    trajectory_from_msg,
    trajectory_to_msg,
    trajectory_to_path,
)

__all__ = [
    "AGENT_TYPES", "EGO_FRAME", "MAP_POLYLINE_TYPES", "MARKER_Z", "SIGNAL_STATES", "WORLD_FRAME",
    "AgentList", "BevFrame", "BevGrid", "CandidateSetArrays", "ControlCommandValues", "EgoMotion",
    "MessageValidationError", "SceneTokenArrays", "TokenSizes", "TrajectoryArrays",
    "bev_from_msg", "bev_to_msg", "candidate_markers_to_cdr", "candidate_markers_to_msg",
    "candidate_set_from_msg", "candidate_set_to_cdr", "candidate_set_to_msg", "control_command_from_msg",
    "control_command_to_msg", "float32_array", "headings_from_points", "make_header",
    "markers_cdr_matches_this_distro", "ns_to_time", "odometry_from_msg", "odometry_to_msg",
    "path_to_trajectory", "perception_inputs_from_msg", "perception_inputs_to_msg",
    "perception_signals_from_msg", "planning_diagnostics_from_msg", "planning_diagnostics_to_msg",
    "scene_tokens_from_msg", "scene_tokens_to_msg", "time_to_ns", "trajectory_from_msg", "trajectory_to_msg",
    "trajectory_to_path", "trajectory_to_path_cdr",
]
