"""ament_python package rad2_bringup: launch files, graph description, parameters, shipped checkpoints and
bundled clips (package share), the local bring-up, demo and harnesses, and the ``rad2`` command."""

import glob
import os

from setuptools import find_packages, setup

PACKAGE = "rad2_bringup"


# What an install carries besides the code, so that one copied away from the checkout runs the demo
# and the default evaluation: the shipped checkpoints (weights and config only; exports, TensorRT
# engines and training runs are caches or outputs) and the bundled splits the demo, the perception
# node's default map and the evaluation tools read (data/train and data/eval_signals stay in the checkout).
CHECKPOINTS = ("rad2_rl_real", "rad2_rl_real_sym", "rad2_rl", "rad2_il", "rad2_il_rich", "rad2_il_real",
               "collision_critic", "self_correction")
CHECKPOINT_FILES = ("config.json", "*.safetensors")
DATA_SPLITS = ("eval_efficiency", "eval_safety", "eval_real")
DATA_FILES = ("index.json", "clips/*.npz", "maps/*.npz")


def _repo() -> str:
    """The rad2 checkout, from this file's real path (ros2_ws/src/rad2_bringup/setup.py)."""
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__)))))


def _repo_files(folder: str, patterns: tuple[str, ...]) -> list[tuple[str, list[str]]]:
    """``(share/rad2_bringup/<dir>, [files])`` entries for the files of ``<repo>/<folder>`` matching
    ``patterns`` (one entry per directory: data_files do not recurse), relative to the working directory.

    colcon runs this file from the package source (plain build) or from a build directory holding a
    symlink to it (--symlink-install), and takes data files relative to that directory only: the
    repository is found from this file's real path and the paths made relative to where we run.
    With --symlink-install colcon also mirrors each data file at <build base>/<its relative path>;
    for the default build/<package> beside src/<package> that is the file itself, so nothing is made.
    """
    repo = _repo()
    by_dir: dict[str, list[str]] = {}
    for pattern in patterns:
        files = sorted(glob.glob(os.path.join(repo, folder, pattern)))
        if not files:
            # Building from a copy of the package without the repository would install nodes that cannot
            # find their parameters, weights or clips: stop here instead.
            raise SystemExit(
                f"{PACKAGE}/setup.py: no {folder}/{pattern} under {repo} (build from the rad2 checkout)")
        for f in files:
            target = os.path.join("share", PACKAGE, os.path.relpath(os.path.dirname(f), repo))
            by_dir.setdefault(target, []).append(os.path.relpath(f))
    return sorted(by_dir.items())


setup(
    name=PACKAGE,
    version="0.1.0",
    packages=find_packages(exclude=["test", "test.*"]),
    data_files=[
        ("share/ament_index/resource_index/packages", [f"resource/{PACKAGE}"]),
        (f"share/{PACKAGE}", ["package.xml"]),
        # rad2_core.config.params_dir() finds them here through the ament index when the source
        # tree is not at hand (a build without --symlink-install, run from elsewhere).
        *_repo_files("params", ("*.yaml",)),
        # the launch files and the graph description they and the local bring-up read
        *_repo_files("launch", ("*.py", "*.yaml")),
        # the Fast DDS profile rad2_ros.rosenv names for an install run away from the checkout
        *_repo_files("tools", ("fastdds_localhost.xml",)),
        # share/rad2_bringup/checkpoints/<name>, share/rad2_bringup/data/<split>: found by
        # rad2_planner.config.resource_path under the same relative paths as in the checkout.
        *(e for name in CHECKPOINTS for e in _repo_files(f"checkpoints/{name}", CHECKPOINT_FILES)),
        *(e for split in DATA_SPLITS for e in _repo_files(f"data/{split}", DATA_FILES)),
    ],
    install_requires=["setuptools"],
    zip_safe=True,
    maintainer="rad2 maintainers",
    maintainer_email="maintainers@rad2.dev",
    description="rad2 bring-up: launch, parameters, checkpoints, bundled clips, the rad2 command",
    license="Apache-2.0",
    entry_points={
        "console_scripts": [
            "rad2 = rad2_bringup.cli:main",
        ],
    },
)
