"""Turn a graph of launch/graphs.yaml into a ROS 2 LaunchDescription (full ROS 2 installs only).

The three launch files call ``generate(<graph>)``; rad2 graph up reads the same graphs.yaml (both
through ``rad2_bringup.graphs``), so `ros2 launch` and the bring-up tool start the same executables
with the same parameter files.
"""

from __future__ import annotations

import os
from pathlib import Path

from launch.actions import DeclareLaunchArgument
from launch.substitutions import LaunchConfiguration
from launch_ros.actions import Node
from rad2_bringup import graphs as rad2_graph

from launch import LaunchDescription


def _parameter_value(value):
    """A graph parameter as a launch parameter: "$(arg X)" becomes LaunchConfiguration("X")."""
    if isinstance(value, str):
        m = rad2_graph._ARG_RE.fullmatch(value)
        if m:
            return LaunchConfiguration(m.group(1))
    return value


def generate(graph_name: str, extra_actions=()) -> LaunchDescription:
    graph = rad2_graph.load_graph(graph_name, substitute_args=False)
    # $RAD2_ROOT names a checkout whose params/ to use; else the checkout's or the installed package's
    root = Path(os.environ["RAD2_ROOT"]) if os.environ.get("RAD2_ROOT") else None
    actions = [
        DeclareLaunchArgument(arg.name, default_value=arg.default, description=arg.description)
        for arg in graph.arguments.values()
    ]
    for spec in graph.nodes:
        parameters = [str(p) for p in spec.param_paths(root)]
        if spec.parameters:
            parameters.append({k: _parameter_value(v) for k, v in spec.parameters.items()})
        actions.append(
            Node(
                package=spec.package,
                executable=spec.executable,
                name=spec.name,
                parameters=parameters,
                remappings=list(spec.remappings.items()),
                output="screen",
                emulate_tty=True,
            )
        )
    actions.extend(extra_actions)
    return LaunchDescription(actions)
