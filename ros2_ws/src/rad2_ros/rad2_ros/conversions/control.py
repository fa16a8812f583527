"""ControlCommand <-> :class:`ControlCommandValues` (acceleration, steering angle and rate, target
speed, emergency stop with its reason)."""

from __future__ import annotations

from dataclasses import dataclass

from rad2_datasets.bags import time_to_ns
from rad2_msgs.msg import ControlCommand

from rad2_ros.conversions.common import EGO_FRAME, check_scalar, f32, make_header


@dataclass
class ControlCommandValues:
    acceleration: float  # m/s^2
    steering_angle: float  # rad
    steering_rate: float  # rad/s
    target_speed: float  # m/s
    emergency_stop: bool = False
    reason: str = ""
    stamp_ns: int = 0
    frame_id: str = EGO_FRAME


_COMMAND_FIELDS = ("acceleration", "steering_angle", "steering_rate", "target_speed")


def control_command_to_msg(cmd: ControlCommandValues) -> ControlCommand:
    msg = ControlCommand()
    msg.header = make_header(cmd.stamp_ns, cmd.frame_id)
    for name in _COMMAND_FIELDS:
        setattr(msg, name, f32(check_scalar("ControlCommand", name, getattr(cmd, name))))
    msg.emergency_stop = bool(cmd.emergency_stop)
    msg.reason = str(cmd.reason)
    return msg


def control_command_from_msg(msg: ControlCommand) -> ControlCommandValues:
    values = {name: check_scalar("ControlCommand", name, getattr(msg, name)) for name in _COMMAND_FIELDS}
    return ControlCommandValues(
        **values,
        emergency_stop=bool(msg.emergency_stop),
        reason=str(msg.reason),
        stamp_ns=time_to_ns(msg.header.stamp),
        frame_id=str(msg.header.frame_id),
    )
