"""Every ament package under ros2_ws/src declares in package.xml each rad2 and ROS package its Python
code imports, and the rad2 packages depend on each other in one direction only (no cycles), so colcon
builds them in the right order and an install of one package pulls in what it needs."""

from __future__ import annotations

import ast
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "ros2_ws" / "src"
PYTHON_PACKAGES = sorted(p.parent.name for p in SRC.glob("*/setup.py"))
ALL_PACKAGES = sorted(p.parent.name for p in SRC.glob("*/package.xml"))
# ROS packages a module may import at run time; each must be declared where it is imported
ROS_PACKAGES = {"rclpy", "ament_index_python", "builtin_interfaces", "rcl_interfaces", "rosgraph_msgs",
                "std_msgs", "geometry_msgs", "nav_msgs", "visualization_msgs", "diagnostic_msgs",
                "sensor_msgs", "launch", "launch_ros"}


def _imports(pkg: str) -> dict[str, set[str]]:
    """Top-level package imported -> the modules of ``pkg`` that import it."""
    out: dict[str, set[str]] = {}
    for path in sorted((SRC / pkg / pkg).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            for name in names:
                out.setdefault(name.split(".")[0], set()).add(str(path.relative_to(SRC)))
    return out


def _declared(pkg: str) -> set[str]:
    root = ET.parse(SRC / pkg / "package.xml").getroot()
    tags = ("depend", "exec_depend", "build_depend", "build_export_depend")
    return {e.text.strip() for t in tags for e in root.findall(t) if e.text}


def test_the_packages_show_the_architecture():
    assert {"rad2_msgs", "rad2_core", "rad2_datasets", "rad2_control", "rad2_planner", "bev_warp_sim",
            "rad2_training", "rad2_evaluation", "rad2_ros", "rad2_bringup"} <= set(ALL_PACKAGES)
    for pkg in ALL_PACKAGES:
        assert ET.parse(SRC / pkg / "package.xml").getroot().findtext("name") == pkg, pkg


@pytest.mark.parametrize("pkg", PYTHON_PACKAGES)
def test_package_xml_declares_every_package_the_code_imports(pkg):
    imported = _imports(pkg)
    wanted = {name for name in imported if name != pkg and (name in ALL_PACKAGES or name in ROS_PACKAGES
                                                            or name.endswith("_msgs"))}
    missing = {name: sorted(imported[name])[:3] for name in wanted - _declared(pkg)}
    assert not missing, f"{pkg}/package.xml does not declare: {missing}"


def test_rad2_dependencies_have_no_cycle():
    graph = {pkg: {d for d in _declared(pkg) if d in ALL_PACKAGES} for pkg in ALL_PACKAGES}
    state: dict[str, int] = {}

    def visit(pkg: str, path: list[str]) -> None:
        if state.get(pkg) == 1:
            raise AssertionError("dependency cycle: " + " -> ".join([*path, pkg]))
        if state.get(pkg) == 2:
            return
        state[pkg] = 1
        for dep in sorted(graph[pkg]):
            visit(dep, [*path, pkg])
        state[pkg] = 2

    for pkg in ALL_PACKAGES:
        visit(pkg, [])


def test_the_algorithm_packages_import_no_ros():
    """Algorithms live in plain Python modules; only the ROS layer and the bring-up talk to ROS."""
    no_ros = ("rad2_core", "rad2_datasets", "rad2_control", "rad2_planner", "bev_warp_sim", "rad2_training")
    for pkg in no_ros:
        ros = {name for name in _imports(pkg) if name in ROS_PACKAGES - {"ament_index_python"}
               or name.endswith("_msgs")}
        assert not ros, f"{pkg} imports ROS: {sorted(ros)}"
