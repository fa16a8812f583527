"""ament_python package rad2_planner:
the rad2 planner: diffusion generator, discriminator, runtimes, post-planning stages."""

from setuptools import find_packages, setup

PACKAGE = "rad2_planner"

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
    description="the rad2 planner: diffusion generator, discriminator, runtimes, post-planning stages",
    license="Apache-2.0",
)
