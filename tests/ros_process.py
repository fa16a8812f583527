"""Helpers for tests (and tools) that run real ROS 2 processes from the colcon build.

- ``require_ros_build()``: skip when ros2_ws/install is missing outside CI; under CI (env var CI set)
  a missing build is a failure, because `make test` always bootstraps first.
- ``unique_domain_id()``: a ROS_DOMAIN_ID derived from the pid, so parallel test runs (other
  checkouts, other helpers) never discover each other's nodes.
- ``ros_env(domain_id)``: os.environ plus the rad2 ROS environment (tools/rosenv.py).
- ``RosProcess``: a Python child with its log captured, ``wait``/``stop`` with timeouts everywhere
  and a SIGINT -> SIGTERM -> SIGKILL teardown; use it as a context manager.
- ``import_ros_messages()``: put the built interface packages on sys.path of this process, for
  tests that build messages in-process (the shared libraries are found through their RUNPATH).
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "tools") not in sys.path:
    sys.path.insert(0, str(ROOT / "tools"))

from rosenv import install_dir, python_path_entries, ros_environment  # noqa: E402

_domain_counter = itertools.count()


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


def unique_domain_id() -> int:
    """A ROS_DOMAIN_ID in 1..200 from this pid and a per-process counter.

    Fast DDS maps domain d to UDP ports 7400 + 250*d (+ offsets), valid up to 232; 0 is left to
    interactive use.
    """
    return 1 + (os.getpid() * 7 + next(_domain_counter)) % 200


def ros_env(domain_id: int | None = None) -> dict[str, str]:
    env = ros_environment(
        domain_id=unique_domain_id() if domain_id is None else domain_id, require_build=True
    )
    # Children print as they go (the logs are read while they run).
    env["PYTHONUNBUFFERED"] = "1"
    return env


def import_ros_messages() -> None:
    """Make rad2_msgs (and the symlinked ament_python packages) importable in this process."""
    for entry in reversed(python_path_entries(ros_environment(require_build=True))):
        if entry not in sys.path:
            sys.path.insert(0, entry)


class RosProcessError(RuntimeError):
    """A child did not start, exit or answer in time, or exited with an error."""


class RosProcess:
    """A Python child process in the ROS environment, with its stdout+stderr in a log file."""

    def __init__(
        self,
        args: list[str],
        env: dict[str, str],
        name: str = "child",
        log_dir: Path | None = None,
        cwd: Path = ROOT,
    ):
        self.name = name
        self.args = list(args)
        log_dir = Path(log_dir) if log_dir is not None else Path(tempfile.mkdtemp(prefix="rad2-ros-"))
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = log_dir / f"{name}.log"
        python = Path(env.get("VIRTUAL_ENV", sys.prefix)) / "bin" / "python"
        self._log = open(self.log_path, "wb")  # noqa: SIM115 (closed in stop())
        self.popen = subprocess.Popen(
            [str(python), *self.args],
            env=env,
            cwd=str(cwd),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: signals reach the whole child tree
        )

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def poll(self) -> int | None:
        return self.popen.poll()

    def wait(self, timeout: float) -> int:
        """Wait for exit; RosProcessError with the log tail if it takes longer than `timeout` s."""
        try:
            return self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired as err:
            raise RosProcessError(
                f"{self.name} did not exit within {timeout:.0f} s; log tail:\n{self.log()[-3000:]}"
            ) from err

    def wait_for_output(self, text: str, timeout: float) -> None:
        """Wait until `text` appears in the log (a readiness line), failing early if the child dies."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if text in self.log():
                return
            if self.popen.poll() is not None:
                raise RosProcessError(
                    f"{self.name} exited with {self.popen.returncode} before printing {text!r}; "
                    f"log tail:\n{self.log()[-3000:]}"
                )
            time.sleep(0.05)
        raise RosProcessError(
            f"{self.name} did not print {text!r} within {timeout:.0f} s; log:\n{self.log()[-3000:]}"
        )

    def stop(self, grace_s: float = 5.0) -> int:
        """SIGINT (rclpy shuts down cleanly), then SIGTERM, then SIGKILL; returns the exit code."""
        if self.popen.poll() is None:
            for sig, wait_s in ((signal.SIGINT, grace_s), (signal.SIGTERM, 2.0), (signal.SIGKILL, 5.0)):
                try:
                    os.killpg(self.popen.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    self.popen.wait(timeout=wait_s)
                    break
                except subprocess.TimeoutExpired:
                    continue
        if not self._log.closed:
            self._log.close()
        return self.popen.returncode if self.popen.returncode is not None else -9

    def __enter__(self) -> RosProcess:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
