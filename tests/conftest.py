"""Make the core packages importable without a colcon build (they import no ROS)."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for pkg_dir in sorted((ROOT / "ros2_ws" / "src").glob("*/setup.py")):
    path = str(pkg_dir.parent)
    if path not in sys.path:
        sys.path.insert(0, path)
