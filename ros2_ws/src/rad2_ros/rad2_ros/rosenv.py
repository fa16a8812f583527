"""The ROS 2 environment of a rad2 checkout, defined once for shells, tests and tools.

`ros_environment()` returns os.environ plus what a process needs to run rad2 nodes from the colcon
build: the project virtualenv (which holds ROS 2 Kilted from PyPI), the venv prefix on
AMENT_PREFIX_PATH/CMAKE_PREFIX_PATH, the colcon install/setup.bash, Fast DDS restricted to this
machine (tools/fastdds_localhost.xml) and the RAD2_* variables. `tools/env.sh` evaluates
`python -S <this file> --shell`, so the list below is the only place these values are written.

Standard library only (no rclpy, no site-packages needed): env.sh runs this file as a script with
`python -S`, and it must work before anything is importable.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _find_repo_root() -> Path:
    """The rad2 checkout this file belongs to: the nearest parent holding tools/env.sh (this file lives
    in ros2_ws/src/rad2_ros/rad2_ros/, reached through colcon's symlinks or the venv's .pth),
    else $RAD2_ROOT (an install without the source tree)."""
    here = Path(__file__).resolve()
    for parent in here.parents:
        if (parent / "tools" / "env.sh").is_file() and (parent / "ros2_ws").is_dir():
            return parent
    env = os.environ.get("RAD2_ROOT")
    return Path(env) if env else here.parents[4]


REPO_ROOT = _find_repo_root()

# Variables bash sets by itself; never part of what install/setup.bash contributes.
_SHELL_BOOKKEEPING = {"_", "SHLVL", "PWD", "OLDPWD"}
# Deprecated names removed from the environment (Fast DDS warns in every process that sees them).
_REMOVED = ("FASTRTPS_DEFAULT_PROFILES_FILE",)


class RosEnvironmentError(RuntimeError):
    """The checkout is not bootstrapped, or install/setup.bash could not be sourced."""


def in_checkout(root: Path = REPO_ROOT) -> bool:
    """Whether ``root`` is a rad2 checkout (else this file runs from a colcon install away from one)."""
    return (root / "tools" / "env.sh").is_file() and (root / "ros2_ws").is_dir()


def venv_dir(root: Path = REPO_ROOT) -> Path:
    """$RAD2_VENV, else the checkout's .venv; an install away from the checkout uses the virtualenv this
    process runs in (its console scripts were built with that interpreter)."""
    env = os.environ.get("RAD2_VENV")
    if env:
        return Path(env)
    if not in_checkout(root) and sys.prefix != sys.base_prefix:
        return Path(sys.prefix)
    return root / ".venv"


def installed_share_file(relative: str, env: dict[str, str] | None = None) -> Path | None:
    """``share/rad2_bringup/<relative>`` under the first prefix of AMENT_PREFIX_PATH that has it (a sourced
    colcon install), found without ament_index_python (this module runs before anything is importable)."""
    for prefix in (os.environ if env is None else env).get("AMENT_PREFIX_PATH", "").split(os.pathsep):
        candidate = Path(prefix) / "share" / "rad2_bringup" / relative if prefix else None
        if candidate is not None and candidate.is_file():
            return candidate
    return None


def install_dir(root: Path = REPO_ROOT) -> Path:
    return root / "ros2_ws" / "install"


def _prepend_path(value: str | None, entry: str) -> str:
    parts = [p for p in (value or "").split(os.pathsep) if p and p != entry]
    return os.pathsep.join([entry, *parts])


def rad2_variables(root: Path = REPO_ROOT) -> dict[str, str]:
    """The fixed variables (no path lists): middleware, DDS profile, discovery range, RAD2_*.

    Away from a checkout (an install sourced on its own) there is no RAD2_ROOT or workspace to name: the
    DDS profile is the installed package's copy and node logs go where ROS puts them by default."""
    if not in_checkout(root):
        installed = {
            "RAD2_VENV": str(venv_dir(root)),
            "RMW_IMPLEMENTATION": "rmw_fastrtps_cpp",
            "ROS_AUTOMATIC_DISCOVERY_RANGE": "LOCALHOST",
            "PYTHONNOUSERSITE": "1",
        }
        profile = installed_share_file("tools/fastdds_localhost.xml")
        if profile is not None:
            installed["FASTDDS_DEFAULT_PROFILES_FILE"] = str(profile)
        return installed
    profile = str(root / "tools" / "fastdds_localhost.xml")
    return {
        "RAD2_ROOT": str(root),
        "RAD2_VENV": str(venv_dir(root)),
        "RAD2_WS": str(root / "ros2_ws"),
        "RMW_IMPLEMENTATION": "rmw_fastrtps_cpp",
        # Fast DDS 3 reads FASTDDS_*; the old FASTRTPS_* name is deprecated (each process warns) and
        # is not set.
        "FASTDDS_DEFAULT_PROFILES_FILE": profile,
        # Keep discovery on this machine (the Kilted replacement of ROS_LOCALHOST_ONLY).
        "ROS_AUTOMATIC_DISCOVERY_RANGE": "LOCALHOST",
        # Node log files go to the (ignored) workspace log dir instead of piling up in ~/.ros/log.
        "ROS_LOG_DIR": str(root / "ros2_ws" / "log" / "ros"),
        "PYTHONNOUSERSITE": "1",
    }


@functools.lru_cache(maxsize=8)
def _source_setup_bash(setup_bash: str, env_items: tuple[tuple[str, str], ...]) -> dict[str, str]:
    # install/setup.bash is not `set -u` safe and prints nothing useful: source it in a throwaway
    # bash and read back the resulting environment (NUL separated, so values may contain newlines).
    script = 'set +u; source "$1" >/dev/null || exit 3; env -0'
    result = subprocess.run(
        ["bash", "-c", script, "rosenv", setup_bash],
        env=dict(env_items),
        capture_output=True,
        timeout=60,
        check=False,
    )
    if result.returncode != 0:
        raise RosEnvironmentError(
            f"sourcing {setup_bash} failed with exit code {result.returncode}: "
            f"{result.stderr.decode(errors='replace').strip()[-2000:]}"
        )
    sourced = {}
    for entry in result.stdout.split(b"\0"):
        if not entry:
            continue
        key, _, value = entry.decode(errors="surrogateescape").partition("=")
        if key not in _SHELL_BOOKKEEPING:
            sourced[key] = value
    return sourced


def ros_environment(
    domain_id: int | None = None,
    base: dict[str, str] | None = None,
    root: Path = REPO_ROOT,
    require_build: bool = False,
) -> dict[str, str]:
    """os.environ (or `base`) plus everything needed to run rad2 ROS processes.

    domain_id: ROS_DOMAIN_ID for the result (tests pass a unique one so parallel runs never meet);
    None keeps whatever the base has. require_build: raise if ros2_ws/install is missing instead of
    returning an environment that only has the venv.
    """
    if domain_id is not None and not (0 <= int(domain_id) <= 232):
        raise ValueError(f"domain_id must be in 0..232 (a valid ROS_DOMAIN_ID), got {domain_id}")
    env = dict(os.environ if base is None else base)
    venv = venv_dir(root)
    if not (venv / "bin" / "python").exists():
        raise RosEnvironmentError(f"no virtualenv at {venv}: run `bash tools/bootstrap.sh` first")
    env["VIRTUAL_ENV"] = str(venv)
    env["PATH"] = _prepend_path(env.get("PATH"), str(venv / "bin"))
    # CMake, rosidl and rclpy's ament_index find the wheel-installed ROS packages only through these.
    env["AMENT_PREFIX_PATH"] = _prepend_path(env.get("AMENT_PREFIX_PATH"), str(venv))
    env["CMAKE_PREFIX_PATH"] = _prepend_path(env.get("CMAKE_PREFIX_PATH"), str(venv))
    # The ROS wheels load their shared libraries from these directories (the venv python sets them
    # up by re-executing itself; children that inherit its guard variable need them already set).
    lib_dirs = [str(venv / "lib")]
    # (globbed, not derived from sys.version: env.sh runs this file with `python -S`.)
    lib_dirs += sorted(str(p) for p in venv.glob("lib/python3*/site-packages/ros_*.libs") if p.is_dir())
    for lib_dir in reversed(lib_dirs):
        env["LD_LIBRARY_PATH"] = _prepend_path(env.get("LD_LIBRARY_PATH"), lib_dir)
    env.update(rad2_variables(root))
    for key in _REMOVED:
        env.pop(key, None)
    if domain_id is not None:
        env["ROS_DOMAIN_ID"] = str(int(domain_id))

    setup_bash = install_dir(root) / "setup.bash"
    if setup_bash.exists():
        env = dict(_source_setup_bash(str(setup_bash), tuple(sorted(env.items()))))
    elif require_build:
        raise RosEnvironmentError(f"{setup_bash} is missing: run `bash tools/bootstrap.sh` to build ros2_ws")
    return env


def python_path_entries(env: dict[str, str]) -> list[str]:
    """PYTHONPATH of a ros_environment() as a list, for processes that cannot restart themselves."""
    return [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]


def shell_exports(env: dict[str, str], current: dict[str, str]) -> str:
    """`export K=V` lines for every variable of env that differs from the current environment (and
    `unset K` for the deprecated names env drops)."""
    lines = [
        f"export {key}={shlex.quote(value)}"
        for key, value in sorted(env.items())
        if current.get(key) != value and key.isidentifier()
    ]
    lines += [f"unset {key}" for key in _REMOVED if key in current and key not in env]
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------
# Child processes in this environment (tests, smoke_graph, bringup)
# --------------------------------------------------------------------------------------------------

_domain_counter = itertools.count()


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


# A process that starts nodes (Bringup, RosProcess) puts its pid here in their environment; the nodes
# stop when it is gone (exit_with_parent). Nodes run in sessions of their own, so a launcher killed
# by SIGKILL, the OOM killer or a crash reaches none of them by signal, and without this they went on
# planning and sending commands with nothing watching them (found by killing demo.py mid-run).
PARENT_PID_ENV = "RAD2_PARENT_PID"
PARENT_POLL_S = 0.5


def exit_with_parent(poll_s: float = PARENT_POLL_S) -> int | None:
    """With ``RAD2_PARENT_PID`` set: a daemon thread sends this process SIGTERM (every node's clean
    stop) once that process is gone; returns the pid watched, None when there is none to watch.

    A direct child notices the parent's death by being re-parented (a dead parent not yet reaped still
    answers ``kill(pid, 0)``); a process started through a wrapper that stays its parent polls the pid."""
    import threading

    text = os.environ.get(PARENT_PID_ENV, "")
    if not text.isdigit() or int(text) <= 1:
        return None
    pid = int(text)
    direct = os.getppid() == pid

    def alive() -> bool:
        if direct:
            return os.getppid() == pid
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:  # exists, owned by someone else
            return True
        return True

    def watch() -> None:
        while alive():
            time.sleep(poll_s)
        print(f"[rad2] the process that started this one (pid {pid}) is gone: stopping", file=sys.stderr,
              flush=True)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="rad2-parent-watch", daemon=True).start()
    return pid


def child_environment(env: dict[str, str]) -> dict[str, str]:
    """``env`` for a node process started by this one: with this pid as the parent it watches."""
    return {**env, PARENT_PID_ENV: str(os.getpid())}


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
        cwd: Path = REPO_ROOT,
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
            env=child_environment(env),
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


def ensure_ros_environment(script: str | Path | list[str], argv: list[str], domain_id: int | None) -> None:
    """Re-execute ``python script argv`` in this environment when rclpy/rad2_msgs are not importable here
    (exits with its return code); otherwise just set ROS_DOMAIN_ID. ``script`` is a file, or the python
    arguments before ``argv`` as a list (``["-m", "rad2_bringup.cli", "graph", "record"]``). Used by the
    ``rad2`` verbs that talk to a live graph (graph record, eval replay, demo) so they also run outside
    ``source tools/env.sh``."""
    try:
        import rad2_msgs.msg  # noqa: F401
        import rclpy  # noqa: F401

        if domain_id is not None:
            os.environ["ROS_DOMAIN_ID"] = str(domain_id)
        return
    except ImportError:
        if os.environ.get("RAD2_RECORD_REEXEC"):
            raise RosEnvironmentError("rclpy / rad2_msgs not importable even in the rad2 environment; run "
                                      "`bash tools/bootstrap.sh`") from None
    env = ros_environment(domain_id, require_build=True)
    env["RAD2_RECORD_REEXEC"] = "1"
    venv_python = str(Path(env["RAD2_VENV"]) / "bin" / "python")
    head = list(script) if isinstance(script, list) else [str(Path(script).resolve())]
    result = subprocess.run([venv_python, *head, *argv], env=env, check=False)
    sys.exit(result.returncode)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Print the rad2 ROS 2 environment (venv, colcon install, Fast DDS on localhost).",
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--shell", action="store_true", help="print bash `export` lines (used by tools/env.sh)")
    mode.add_argument(
        "--show", action="store_true", help="print only the rad2/ROS variables as K=V (default)"
    )
    parser.add_argument("--domain-id", type=int, default=None, help="also set ROS_DOMAIN_ID (0..232)")
    args = parser.parse_args(argv)
    try:
        env = ros_environment(domain_id=args.domain_id)
    except (RosEnvironmentError, ValueError) as err:
        print(f"rosenv: {err}", file=sys.stderr)
        return 1
    if args.shell:
        print(shell_exports(env, dict(os.environ)))
        return 0
    interesting = (
        "RAD2_",
        "ROS_",
        "RMW_",
        "FAST",
        "AMENT_",
        "CMAKE_PREFIX",
        "PYTHONPATH",
        "LD_LIBRARY",
        "COLCON_",
        "VIRTUAL_ENV",
    )
    for key in sorted(env):
        if key.startswith(interesting):
            print(f"{key}={env[key]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
