"""ament_python package of the rad2 planner core and its ROS 2 nodes."""

import glob
import os

from setuptools import find_packages, setup

PACKAGE = "rad2_planner"


def _params_files() -> list[str]:
    """params/*.yaml of the repository (values and their schemas), relative to the working directory.

    colcon runs this file from the package source (plain build) or from a build directory holding a
    symlink to it (--symlink-install), and takes data files relative to that directory only: the
    repository is found from this file's real path and the paths made relative to where we run.
    With --symlink-install colcon also mirrors each data file at <build base>/<its relative path>;
    for the default build/<package> beside src/<package> that is the file itself, so nothing is made.
    """
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__)))))
    files = sorted(glob.glob(os.path.join(repo, "params", "*.yaml")))
    if not files:
        # Building from a copy of the package without the repository would install nodes that cannot
        # find a single parameter: stop here instead.
        raise SystemExit(f"{PACKAGE}/setup.py: no params/*.yaml under {repo} (build from the rad2 checkout)")
    return [os.path.relpath(f) for f in files]


setup(
    name=PACKAGE,
    version="0.1.0",
    # find_packages so every subpackage (control, networks, adapters, scenarios, runtime, training,
    # nodes, ...) is installed without listing it here.
    packages=find_packages(exclude=["test", "test.*"]),
    data_files=[
        ("share/ament_index/resource_index/packages", [f"resource/{PACKAGE}"]),
        (f"share/{PACKAGE}", ["package.xml"]),
        # rad2_planner.config.params_dir() finds them here through the ament index when the source
        # tree is not at hand (a build without --symlink-install, run from elsewhere); bev_warp_sim and
        # rad2_rl read their parameters through rad2_planner.config too, so one installed copy serves all.
        (f"share/{PACKAGE}/params", _params_files()),
    ],
    install_requires=["setuptools"],
    zip_safe=True,
    maintainer="rad2 maintainers",
    maintainer_email="maintainers@rad2.dev",
    description="rad2 onboard planner: perception features, diffusion planner, controller, ROS 2 nodes",
    license="Apache-2.0",
    entry_points={
        "console_scripts": [
            "perception_node = rad2_planner.nodes.perception_node:main",
            "planner_node = rad2_planner.nodes.planner_node:main",
            "controller_node = rad2_planner.nodes.controller_node:main",
            "supervisor_node = rad2_planner.nodes.supervisor_node:main",
        ],
    },
)
