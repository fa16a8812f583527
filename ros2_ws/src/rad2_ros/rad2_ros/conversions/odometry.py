"""nav_msgs/Odometry <-> :class:`EgoMotion` (ego box-centre pose in the world frame, speed along the
heading, yaw rate; the twist in the child frame as REP-105 has it)."""

from __future__ import annotations

from dataclasses import dataclass

from nav_msgs.msg import Odometry
from rad2_core.geometry import yaw_to_quaternion
from rad2_datasets.bags import time_to_ns

from rad2_ros.conversions.common import EGO_FRAME, WORLD_FRAME, check_scalar, make_header, orientation_to_yaw


@dataclass
class EgoMotion:
    """Ego pose (box centre, world frame) and motion: speed along the heading, yaw rate."""

    x: float
    y: float
    yaw: float
    speed: float
    yaw_rate: float
    stamp_ns: int = 0
    frame_id: str = WORLD_FRAME
    child_frame_id: str = EGO_FRAME


def odometry_to_msg(motion: EgoMotion) -> Odometry:
    kind = "Odometry"
    msg = Odometry()
    msg.header = make_header(motion.stamp_ns, motion.frame_id)
    msg.child_frame_id = str(motion.child_frame_id)
    msg.pose.pose.position.x = check_scalar(kind, "pose.pose.position.x", motion.x)
    msg.pose.pose.position.y = check_scalar(kind, "pose.pose.position.y", motion.y)
    qx, qy, qz, qw = yaw_to_quaternion(check_scalar(kind, "pose.pose.orientation(yaw)", motion.yaw))
    msg.pose.pose.orientation.x, msg.pose.pose.orientation.y = qx, qy
    msg.pose.pose.orientation.z, msg.pose.pose.orientation.w = qz, qw
    # Twist is expressed in child_frame_id (REP-105): forward speed is linear.x.
    msg.twist.twist.linear.x = check_scalar(kind, "twist.twist.linear.x", motion.speed)
    msg.twist.twist.angular.z = check_scalar(kind, "twist.twist.angular.z", motion.yaw_rate)
    return msg


def odometry_from_msg(msg: Odometry) -> EgoMotion:
    kind = "Odometry"
    pos = msg.pose.pose.position
    x = check_scalar(kind, "pose.pose.position.x", pos.x)
    y = check_scalar(kind, "pose.pose.position.y", pos.y)
    yaw = orientation_to_yaw(kind, "pose.pose.orientation", msg.pose.pose.orientation)
    speed = check_scalar(kind, "twist.twist.linear.x", msg.twist.twist.linear.x)
    yaw_rate = check_scalar(kind, "twist.twist.angular.z", msg.twist.twist.angular.z)
    return EgoMotion(
        x,
        y,
        yaw,
        speed,
        yaw_rate,
        time_to_ns(msg.header.stamp),
        str(msg.header.frame_id),
        str(msg.child_frame_id),
    )
