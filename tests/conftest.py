"""Make the core packages importable without a colcon build (they import no ROS)."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for pkg in ("rad2_planner", "bev_warp_sim"):
    path = str(ROOT / "ros2_ws" / "src" / pkg)
    if path not in sys.path:
        sys.path.insert(0, path)
