"""ament_python package rad2_control: the iLQR trajectory tracker of rad2"""

from setuptools import find_packages, setup

PACKAGE = "rad2_control"

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
    description="the iLQR trajectory tracker of rad2",
    license="Apache-2.0",
)
