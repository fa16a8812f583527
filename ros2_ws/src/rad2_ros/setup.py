"""ament_python package rad2_ros: the ROS 2 nodes and message conversion of rad2"""

from setuptools import find_packages, setup

PACKAGE = "rad2_ros"

setup(
    name=PACKAGE,
    version="0.2.0",
    packages=find_packages(exclude=["test", "test.*"]),
    data_files=[
        ("share/ament_index/resource_index/packages", [f"resource/{PACKAGE}"]),
        (f"share/{PACKAGE}", ["package.xml"]),
    ],
    install_requires=["setuptools"],
    zip_safe=True,
    maintainer="rad2 maintainers",
    maintainer_email="maintainers@rad2.dev",
    description="the ROS 2 nodes and message conversion of rad2",
    license="Apache-2.0",
    entry_points={
        "console_scripts": [
            "perception_node = rad2_ros.nodes.perception_node:main",
            "planner_node = rad2_ros.nodes.planner_node:main",
            "controller_node = rad2_ros.nodes.controller_node:main",
            "supervisor_node = rad2_ros.nodes.supervisor_node:main",
            "sim_node = rad2_ros.nodes.sim_node:main",
        ],
    },
)
