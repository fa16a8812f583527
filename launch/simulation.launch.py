"""Closed-loop simulation / HIL: BEV-Warp sim node + planner + controller.

    ros2 launch launch/simulation.launch.py dataset:=data/eval_safety num_clips:=3

Nodes, executables and parameter files come from launch/graphs.yaml (graph "simulation"), the same
description rad2 graph up and `make demo` start on machines without `launch`.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _rad2_launch import generate  # noqa: E402


def generate_launch_description():
    return generate("simulation")
