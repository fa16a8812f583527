"""Live latency records: PlanningDiagnostics received over DDS for a while (rclpy; needs the built
rad2_msgs). The records are the plain dicts of rad2_ros.latency, summarised there; the CLI is
rad2 eval latency-report --duration.
"""

from __future__ import annotations

import os
import time
from typing import Any

from rad2_ros.latency import diagnostics_record


def records_live(topic: str, duration_s: float, domain_id: int | None = None) -> list[dict[str, Any]]:
    """Subscribe to ``topic`` for ``duration_s`` seconds (rclpy; needs the built rad2_msgs)."""
    if domain_id is not None:
        os.environ["ROS_DOMAIN_ID"] = str(domain_id)
    import rclpy
    from rclpy.qos import QoSProfile, ReliabilityPolicy

    try:
        from rad2_msgs.msg import PlanningDiagnostics
    except ImportError as exc:
        raise RuntimeError("rad2_msgs is not importable: build the workspace (tools/bootstrap.sh) and "
                           "source tools/env.sh") from exc
    from rich.progress import Progress

    records: list[dict[str, Any]] = []
    rclpy.init()
    node = rclpy.create_node("latency_report")
    try:
        qos = QoSProfile(depth=100, reliability=ReliabilityPolicy.RELIABLE)
        node.create_subscription(
            PlanningDiagnostics, topic,
            lambda msg: records.append(diagnostics_record(msg, time.time_ns())), qos)
        end = time.monotonic() + duration_s
        with Progress() as progress:
            task = progress.add_task(f"listening on {topic}", total=duration_s)
            while time.monotonic() < end:
                rclpy.spin_once(node, timeout_sec=0.1)
                progress.update(task, completed=duration_s - max(end - time.monotonic(), 0.0),
                                description=f"listening on {topic}: {len(records)} msgs")
    finally:
        node.destroy_node()
        rclpy.try_shutdown()
    return records
