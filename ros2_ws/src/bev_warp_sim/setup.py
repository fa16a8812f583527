"""ament_python package bev_warp_sim: the BEV-Warp closed-loop simulator"""

from setuptools import find_packages, setup

PACKAGE = "bev_warp_sim"

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
    description="the BEV-Warp closed-loop simulator",
    license="Apache-2.0",
)
