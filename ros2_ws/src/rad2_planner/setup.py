"""ament_python package of the rad2 planner core and its ROS 2 nodes."""

from setuptools import find_packages, setup

PACKAGE = "rad2_planner"

setup(
    name=PACKAGE,
    version="0.1.0",
    # find_packages so every subpackage (control, networks, adapters, scenarios, runtime, training,
    # nodes, ...) is installed without listing it here.
    packages=find_packages(exclude=["test", "test.*"]),
    data_files=[
        ("share/ament_index/resource_index/packages", [f"resource/{PACKAGE}"]),
        (f"share/{PACKAGE}", ["package.xml"]),
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
