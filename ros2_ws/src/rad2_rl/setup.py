"""ament_python package of rad2's closed-loop reinforcement learning (no ROS nodes)."""

from setuptools import find_packages, setup

PACKAGE = "rad2_rl"

setup(
    name=PACKAGE,
    version="0.1.0",
    packages=find_packages(exclude=["test", "test.*"]),
    data_files=[
        ("share/ament_index/resource_index/packages", [f"resource/{PACKAGE}"]),
        (f"share/{PACKAGE}", ["package.xml"]),
    ],
    install_requires=["setuptools"],
    zip_safe=True,
    maintainer="rad2 maintainers",
    maintainer_email="maintainers@rad2.dev",
    description="rad2 closed-loop RL: Ray rollout workers, scenario curation, RL algorithms",
    license="Apache-2.0",
)
