"""Test tiers and import paths for every test of rad2.

Tiers (folder = marker): ``tests/unit`` (``-m unit``: pure functions and small objects, seconds),
``tests/integration`` (``-m integration``: training, rollouts, runtimes, tools as processes) and
``tests/ros`` (``-m ros``: nodes and graphs over DDS, needs the colcon build). ``make test`` runs all,
``make test-fast`` the unit tier.
"""

import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
# The core packages import without a colcon build (they import no ROS); the shared test helpers
# (synthetic_scenes, tiny_models, ros_process, ...) live beside this file.
for path in [str(TESTS), *(str(p.parent) for p in sorted((ROOT / "ros2_ws" / "src").glob("*/setup.py")))]:
    if path not in sys.path:
        sys.path.insert(0, path)

TIERS = ("unit", "integration", "ros")


def pytest_configure(config):
    for tier in TIERS:
        config.addinivalue_line("markers", f"{tier}: tests of tests/{tier}")


def pytest_collection_modifyitems(config, items):
    for item in items:
        tier = Path(str(item.fspath)).parent.name
        if tier in TIERS:
            item.add_marker(getattr(pytest.mark, tier))
