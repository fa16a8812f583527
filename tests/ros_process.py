"""Helpers for tests (and tools) that run real ROS 2 processes from the colcon build.

- ``require_ros_build()``: skip when ros2_ws/install is missing outside CI; under CI (env var CI set)
  a missing build is a failure, because `make test` always bootstraps first.
- ``unique_domain_id()``: a ROS_DOMAIN_ID derived from the pid, so parallel test runs (other
  checkouts, other helpers) never discover each other's nodes.
- ``ros_env(domain_id)``: os.environ plus the rad2 ROS environment (rad2_ros/rosenv.py).
- ``RosProcess``: a Python child with its log captured, ``wait``/``stop`` with timeouts everywhere
  and a SIGINT -> SIGTERM -> SIGKILL teardown; use it as a context manager.
  (``unique_domain_id``, ``ros_env`` and ``RosProcess`` are defined in rad2_ros/rosenv.py.)
- ``import_ros_messages()``: put the built interface packages on sys.path of this process, for
  tests that build messages in-process (the shared libraries are found through their RUNPATH).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

# The process helpers live in rad2_ros/rosenv.py (tools use them too); re-exported for the tests.
from rad2_ros.rosenv import (  # noqa: F401
    RosProcess,
    RosProcessError,
    install_dir,
    python_path_entries,
    ros_env,
    ros_environment,
    unique_domain_id,
)

ROOT = Path(__file__).resolve().parents[1]
# exit code of a test driver whose run never reached the state its test needs (e.g. the processes of a
# graph never discovered each other): the test may retry it; any other non-zero code is a failure
PRECONDITION_UNMET = 3


def build_available() -> bool:
    return (install_dir() / "setup.bash").exists()


def ros_build_missing_reason() -> str | None:
    """None when ROS tests can run; otherwise why they cannot (only ever returned outside CI)."""
    if build_available():
        return None
    reason = f"{install_dir()} is missing (run `bash tools/bootstrap.sh` or `make test`)"
    if os.environ.get("CI"):
        raise RuntimeError(f"CI is set but the colcon build is missing: {reason}")
    return reason


def require_ros_build() -> None:
    """pytest.skip with a clear reason when the build is absent and CI is unset; fail under CI."""
    import pytest

    reason = ros_build_missing_reason()
    if reason is not None:
        pytest.skip(reason)


def import_ros_messages() -> None:
    """Make rad2_msgs (and the symlinked ament_python packages) importable in this process."""
    for entry in reversed(python_path_entries(ros_environment(require_build=True))):
        if entry not in sys.path:
            sys.path.insert(0, entry)
