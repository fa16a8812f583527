"""On the vehicle: BEV perception-features node -> planner -> controller.

    ros2 launch launch/vehicle.launch.py map_file:=data/eval_efficiency

Nodes, executables and parameter files come from launch/graphs.yaml (graph "vehicle"), the same
description rad2 graph up starts on machines without `launch`.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _rad2_launch import generate  # noqa: E402


def generate_launch_description():
    return generate("vehicle")
