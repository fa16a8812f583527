"""PlanningDiagnostics <-> a planning cycle's report: per-stage latencies in order, totals, deadline
misses, counters and the fallback state."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rad2_datasets.bags import planning_diagnostics_record
from rad2_msgs.msg import PlanningDiagnostics, StageLatency

from rad2_ros.conversions.common import check_scalar, f32, fail, make_header, ns_to_time


def planning_diagnostics_to_msg(
    stage_ms: Mapping[str, float],
    *,
    node: str,
    backend: str,
    stamp_ns: int = 0,
    input_stamp_ns: int = 0,
    total_ms: float | None = None,
    end_to_end_ms: float = 0.0,
    deadline_missed: bool = False,
    cycle_count: int = 0,
    deadline_miss_count: int = 0,
    rejected_input_count: int = 0,
    fallback_active: bool = False,
    fallback_reason: str = "",
) -> PlanningDiagnostics:
    """Encode a cycle report; stage order is kept; total_ms defaults to the sum of the stages."""
    kind = "PlanningDiagnostics"
    msg = PlanningDiagnostics()
    msg.header = make_header(stamp_ns, "")
    msg.input_stamp = ns_to_time(input_stamp_ns)
    msg.node = str(node)
    msg.backend = str(backend)
    stages = []
    for name, ms in stage_ms.items():
        ms = check_scalar(kind, f"stages[{name!r}].milliseconds", ms)
        if ms < 0:
            raise fail(kind, f"stages[{name!r}].milliseconds", f"is {ms}, expected >= 0")
        stages.append(StageLatency(name=str(name), milliseconds=f32(ms)))
    msg.stages = stages
    msg.total_ms = f32(
        check_scalar(kind, "total_ms", sum(s.milliseconds for s in stages) if total_ms is None else total_ms)
    )
    msg.end_to_end_ms = f32(check_scalar(kind, "end_to_end_ms", end_to_end_ms))
    msg.deadline_missed = bool(deadline_missed)
    for name, value in (
        ("cycle_count", cycle_count),
        ("deadline_miss_count", deadline_miss_count),
        ("rejected_input_count", rejected_input_count),
    ):
        if int(value) < 0:
            raise fail(kind, name, f"is {value}, expected >= 0")
        setattr(msg, name, int(value))
    msg.fallback_active = bool(fallback_active)
    msg.fallback_reason = str(fallback_reason)
    return msg


def planning_diagnostics_from_msg(msg: PlanningDiagnostics) -> dict[str, Any]:
    """-> dict with `stages` (name -> ms, in order) and every other field under its message name."""
    kind = "PlanningDiagnostics"
    seen: set[str] = set()
    for k, stage in enumerate(msg.stages):
        if stage.name in seen:
            raise fail(kind, f"stages[{k}].name", f"repeats stage {stage.name!r}")
        seen.add(stage.name)
        check_scalar(kind, f"stages[{k}].milliseconds", stage.milliseconds)
    check_scalar(kind, "total_ms", msg.total_ms)
    check_scalar(kind, "end_to_end_ms", msg.end_to_end_ms)
    return planning_diagnostics_record(msg)
