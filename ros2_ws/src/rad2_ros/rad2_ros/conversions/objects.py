"""Perceived objects: agents as parallel arrays (:class:`AgentList`) <-> ``AgentState`` lists, and
``PerceptionInputs`` (the agents and the traffic-signal states perception reports).

The agent conversion is shared with the scene tokens, which carry the same ``AgentState`` entries.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from geometry_msgs.msg import Pose2D
from rad2_datasets.bags import time_to_ns
from rad2_msgs.msg import AgentState, PerceptionInputs, TrafficSignal

from rad2_ros.conversions.common import (
    WORLD_FRAME,
    as_array,
    check_angles,
    check_finite,
    f32,
    fail,
    make_header,
)

AGENT_TYPES = (
    AgentState.TYPE_VEHICLE,
    AgentState.TYPE_PEDESTRIAN,
    AgentState.TYPE_CYCLIST,
    AgentState.TYPE_OTHER,
)


@dataclass
class AgentList:
    """Agents as parallel arrays [N]: box centre pose, box size, velocity, id and type."""

    ids: np.ndarray  # int64
    types: np.ndarray  # uint8, AgentState.TYPE_*
    x: np.ndarray
    y: np.ndarray
    yaw: np.ndarray
    length: np.ndarray
    width: np.ndarray
    vx: np.ndarray
    vy: np.ndarray

    def __len__(self) -> int:
        return len(self.ids)


def agent_list_to_states(kind: str, agents: AgentList) -> list[AgentState]:
    n = len(agents.ids)
    cols = {}
    for name in ("x", "y", "yaw", "length", "width", "vx", "vy"):
        cols[name] = as_array(kind, f"agents.{name}", getattr(agents, name), (n,), np.float64)
    types = as_array(kind, "agents.types", agents.types, (n,), np.int64)
    bad_types = [int(t) for t in types if int(t) not in AGENT_TYPES]
    if bad_types:
        raise fail(kind, "agents.type", f"has unknown values {bad_types[:5]}, expected one of {AGENT_TYPES}")
    ids = as_array(kind, "agents.id", agents.ids, (n,), np.int64)
    states = []
    for k in range(n):
        states.append(
            AgentState(
                id=int(ids[k]),
                type=int(types[k]),
                pose=Pose2D(x=float(cols["x"][k]), y=float(cols["y"][k]), theta=float(cols["yaw"][k])),
                length=f32(cols["length"][k]),
                width=f32(cols["width"][k]),
                velocity_x=f32(cols["vx"][k]),
                velocity_y=f32(cols["vy"][k]),
            )
        )
    return states


def agent_states_to_list(kind: str, states: Sequence[AgentState]) -> AgentList:
    n = len(states)
    out = AgentList(
        ids=np.array([s.id for s in states], dtype=np.int64),
        types=np.array([s.type for s in states], dtype=np.uint8),
        x=np.array([s.pose.x for s in states], dtype=np.float64),
        y=np.array([s.pose.y for s in states], dtype=np.float64),
        yaw=np.array([s.pose.theta for s in states], dtype=np.float64),
        length=np.array([s.length for s in states], dtype=np.float64),
        width=np.array([s.width for s in states], dtype=np.float64),
        vx=np.array([s.velocity_x for s in states], dtype=np.float64),
        vy=np.array([s.velocity_y for s in states], dtype=np.float64),
    )
    for name in ("x", "y", "length", "width", "vx", "vy"):
        check_finite(kind, f"agents.{name}", getattr(out, name))
    check_angles(kind, "agents[{}].pose.theta", out.yaw)
    bad = [int(t) for t in out.types if int(t) not in AGENT_TYPES]
    if bad:
        raise fail(kind, "agents.type", f"has unknown values {bad[:5]}, expected one of {AGENT_TYPES}")
    if n and (np.any(out.length <= 0) or np.any(out.width <= 0)):
        k = int(np.argmax((out.length <= 0) | (out.width <= 0)))
        raise fail(
            kind, f"agents[{k}]", f"has box {out.length[k]}x{out.width[k]} m, expected positive sizes"
        )
    return out


def perception_inputs_to_msg(
    agents: AgentList, stamp_ns: int = 0, frame_id: str = WORLD_FRAME,
    signals: Mapping[int, int] | None = None,
) -> PerceptionInputs:
    """``signals``: map signal id -> state (clip.SIGNAL_*, = TrafficSignal.STATE_*)."""
    msg = PerceptionInputs()
    msg.header = make_header(stamp_ns, frame_id)
    msg.agents = agent_list_to_states("PerceptionInputs", agents)
    msg.signals = [TrafficSignal(signal_id=int(k), state=int(v)) for k, v in (signals or {}).items()]
    return msg


SIGNAL_STATES = (TrafficSignal.STATE_UNKNOWN, TrafficSignal.STATE_RED, TrafficSignal.STATE_YELLOW,
                 TrafficSignal.STATE_GREEN)


def perception_signals_from_msg(msg: PerceptionInputs) -> dict[int, int]:
    """signal id -> state of the message's traffic signals (a bad state or a repeated id is an error
    naming the entry)."""
    out: dict[int, int] = {}
    for k, sig in enumerate(msg.signals):
        if int(sig.state) not in SIGNAL_STATES:
            raise fail("PerceptionInputs", f"signals[{k}].state",
                        f"is {sig.state}, expected one of {SIGNAL_STATES}")
        if int(sig.signal_id) in out:
            raise fail("PerceptionInputs", f"signals[{k}].signal_id", f"repeats signal {sig.signal_id}")
        out[int(sig.signal_id)] = int(sig.state)
    return out


def perception_inputs_from_msg(msg: PerceptionInputs) -> tuple[AgentList, int, str]:
    """-> (agents, stamp_ns, frame_id)."""
    agents = agent_states_to_list("PerceptionInputs", msg.agents)
    ids = agents.ids.tolist()
    if len(set(ids)) != len(ids):
        raise fail("PerceptionInputs", "agents.id", f"has duplicate ids {sorted(ids)}")
    return agents, time_to_ns(msg.header.stamp), str(msg.header.frame_id)
