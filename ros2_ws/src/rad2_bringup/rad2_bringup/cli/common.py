"""What the verbs of the ``rad2`` command share: the parser (program ``rad2 <group> <verb>``, the verb
module's docstring as description, which ends with its examples), dataset arguments found from any
working directory, and the re-execution of a verb that talks to a live graph in the ROS environment."""

from __future__ import annotations

import argparse
from pathlib import Path


def verb_parser(command: str, doc: str | None) -> argparse.ArgumentParser:
    """The parser of ``rad2 <command>`` (e.g. ``"eval policy"``) described by ``doc``, kept as written."""
    return argparse.ArgumentParser(prog=f"rad2 {command}", description=doc,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)


def find_dataset(path: str | Path) -> Path | None:
    """The clip dataset directory (holding index.json) that ``path`` names: relative to the working
    directory first, else a repository-relative name (``data/eval_safety``) in the checkout or in the
    installed package share (``rad2_core.config.resource_path``); None when neither is one."""
    p = Path(path)
    if (p / "index.json").is_file():
        return p
    from rad2_core.config import ResourceNotFoundError, resource_path

    try:
        found = resource_path(p)
    except ResourceNotFoundError:
        return None
    return found if (found / "index.json").is_file() else None


def dataset_dirs(ap: argparse.ArgumentParser, option: str, paths: list[str]) -> list[Path]:
    """``find_dataset`` of each of ``paths``; an argparse error naming ``option`` and the path (exit 2)
    for one that is not a dataset."""
    found = []
    for p in paths:
        d = find_dataset(p)
        if d is None:
            ap.error(f"{option}: {p} is not a dataset directory (no index.json)")
        found.append(d)
    return found


def simulation_params(items: list[str], option: str = "--sim-set") -> tuple[dict, dict]:
    """(every file of params/ loaded, by name, params/sim.yaml with the ``KEY=VALUE`` items applied; the
    applied ``{KEY: value}``): what a verb that simulates passes down (``rad2_core.config.merged`` of it
    is what the simulator and the policies take). Each item is checked against the schema, and the
    whole by building a Simulator (``sim.dt=0.2`` passes the schema but not the controller's step); a
    ParameterError names ``option`` and what is wrong."""
    from bev_warp_sim.simulator import Simulator
    from bev_warp_sim.state import SimulationError
    from rad2_core.config import ParameterError, load_all, merged, params_with_overrides

    files = load_all()
    files["sim"], applied = params_with_overrides("sim", list(items), option)
    if applied:
        try:
            Simulator(merged(files, *files))
        except SimulationError as exc:
            raise ParameterError(f"{option}: {exc}") from None
    return files, applied


def in_ros_environment(command: str, argv: list[str], domain_id: int | None) -> None:
    """Make rclpy and rad2_msgs importable for ``rad2 <command> argv``: when they are not (outside
    ``source tools/env.sh``), run ``python -m rad2_bringup.cli <command> argv`` in the checkout's ROS
    environment and exit with its status; otherwise only set ROS_DOMAIN_ID (rad2_ros.rosenv)."""
    from rad2_ros.rosenv import ensure_ros_environment

    ensure_ros_environment(["-m", "rad2_bringup.cli", *command.split()], argv, domain_id)
