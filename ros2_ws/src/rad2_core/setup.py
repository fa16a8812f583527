"""ament_python package rad2_core:
the no-ROS data model of rad2 (config, geometry, clips and maps, observation, tokens, BEV, validators)."""

from setuptools import find_packages, setup

PACKAGE = "rad2_core"

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
    description="the no-ROS data model of rad2: config, geometry, clips and maps, tokens, BEV, validators",
    license="Apache-2.0",
)
