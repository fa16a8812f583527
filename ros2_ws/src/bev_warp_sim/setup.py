"""ament_python package of the BEV-Warp simulator and its ROS 2 node."""

from setuptools import find_packages, setup

PACKAGE = "bev_warp_sim"

setup(
    name=PACKAGE,
    version="0.1.0",
    packages=find_packages(exclude=["test", "test.*"]),
    data_files=[
        ("share/ament_index/resource_index/packages", [f"resource/{PACKAGE}"]),
        (f"share/{PACKAGE}", ["package.xml"]),
        # No params/ here: the simulator reads params/sim.yaml (and bev.yaml, vehicle.yaml) through
        # rad2_planner.config.params_dir(), which looks in share/rad2_planner/params, where
        # rad2_planner's setup.py installs every params/*.yaml; a second copy here would be read by nothing.
    ],
    install_requires=["setuptools"],
    zip_safe=True,
    maintainer="rad2 maintainers",
    maintainer_email="maintainers@rad2.dev",
    description="BEV-Warp closed-loop simulator: warping, safety, rewards, metrics, ROS 2 node",
    license="Apache-2.0",
    entry_points={
        "console_scripts": [
            "sim_node = bev_warp_sim.nodes.sim_node:main",
        ],
    },
)
