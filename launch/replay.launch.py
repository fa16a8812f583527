"""Bag replay: play a bag of perception inputs into the perception-features node and the planner.

    ros2 launch launch/replay.launch.py bag:=runs/clip_bag map_file:=data/eval_efficiency

Nodes, executables and parameter files come from launch/graphs.yaml (graph "replay"); this file only
adds the `ros2 bag play --clock` process (rad2 eval replay plays bags where rosbag2 is absent).
"""

import sys
from pathlib import Path

from launch.actions import DeclareLaunchArgument, ExecuteProcess
from launch.substitutions import LaunchConfiguration

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _rad2_launch import generate  # noqa: E402


def generate_launch_description():
    return generate(
        "replay",
        extra_actions=[
            DeclareLaunchArgument("bag", description="rosbag2 directory (MCAP) of perception inputs"),
            DeclareLaunchArgument("rate", default_value="1.0", description="playback rate"),
            ExecuteProcess(
                cmd=["ros2", "bag", "play", LaunchConfiguration("bag"), "--clock",
                     "--rate", LaunchConfiguration("rate")],
                output="screen",
            ),
        ],
    )
