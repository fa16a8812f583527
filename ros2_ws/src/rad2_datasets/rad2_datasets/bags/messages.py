"""rad2's rosbag2 typestore: the ROS 2 Kilted standard messages plus ``rad2_msgs`` (registered from
the ``.msg`` files, so no colcon build is needed), types found in the ament prefixes, new messages,
stamps and plain CDR (de)serialization. The constants and the error of the bag modules live here.
"""

from __future__ import annotations

import os
import sys
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
from rosbags.typesys import Stores, get_types_from_msg, get_typestore
from rosbags.typesys.store import Typestore

RAD2_MSGS_PACKAGE = "rad2_msgs"
TYPESTORE_DISTRO = Stores.ROS2_KILTED
ROSBAG2_VERSION = 9
#: Prefix of the rad2 keys in ``metadata.yaml`` ``custom_data``.
META_PREFIX = "rad2."
#: The command that repairs a bag whose writer died (named in the errors that meet such a bag).
REPAIR_COMMAND = "rad2 data repair-bag"
#: Suffix given to the damaged originals that recover_bag keeps beside the repaired bag.
DAMAGED_SUFFIX = ".damaged"
_MCAP_MAGIC = b"\x89MCAP0\r\n"

_PRIMITIVE_DTYPES = {
    "bool": np.bool_,
    "byte": np.uint8,
    "char": np.uint8,
    "uint8": np.uint8,
    "int8": np.int8,
    "uint16": np.uint16,
    "int16": np.int16,
    "uint32": np.uint32,
    "int32": np.int32,
    "uint64": np.uint64,
    "int64": np.int64,
    "float32": np.float32,
    "float64": np.float64,
}


class BagError(RuntimeError):
    """A bag is missing, unreadable, corrupt, or lacks what was asked for (topic, type)."""




# --------------------------------------------------------------------------------------------------
# Types
# --------------------------------------------------------------------------------------------------


def normalize_msgtype(name: str) -> str:
    """``nav_msgs/Odometry`` or ``nav_msgs/msg/Odometry`` -> ``nav_msgs/msg/Odometry``."""
    parts = name.strip().strip("/").split("/")
    if len(parts) == 2:
        return f"{parts[0]}/msg/{parts[1]}"
    if len(parts) == 3:
        return "/".join(parts)
    raise BagError(f"not a ROS message type name: {name!r} (expected pkg/msg/Name)")


def _share_dirs() -> list[Path]:
    """``share`` directories of the ament prefixes, most specific first."""
    prefixes = [p for p in os.environ.get("AMENT_PREFIX_PATH", "").split(os.pathsep) if p]
    prefixes += [sys.prefix]
    out: list[Path] = []
    for prefix in prefixes:
        share = Path(prefix) / "share"
        if share.is_dir() and share not in out:
            out.append(share)
    return out


def rad2_msgs_dir() -> Path:
    """Directory with the rad2_msgs ``.msg`` files.

    ``$RAD2_MSGS_DIR`` if set, else the source tree (``ros2_ws/src/rad2_msgs/msg``), else an installed
    ``share/rad2_msgs/msg`` on an ament prefix.
    """
    env = os.environ.get("RAD2_MSGS_DIR")
    candidates = [Path(env)] if env else []
    here = Path(__file__).resolve()
    candidates += [parent / "msgs" / "msg" for parent in here.parents]
    candidates += [share / RAD2_MSGS_PACKAGE / "msg" for share in _share_dirs()]
    for cand in candidates:
        if cand.is_dir() and any(cand.glob("*.msg")):
            return cand
    raise BagError("cannot find the rad2_msgs .msg files; set RAD2_MSGS_DIR to ros2_ws/src/rad2_msgs/msg")


def _types_from_msg_dir(package: str, msg_dir: Path) -> dict:
    types: dict = {}
    for path in sorted(msg_dir.glob("*.msg")):
        types.update(get_types_from_msg(path.read_text(), f"{package}/msg/{path.stem}"))
    return types


def ensure_type(store: Typestore, msgtype: str) -> None:
    """Make ``store`` know ``msgtype``, loading ``share/<pkg>/msg/<Name>.msg`` files if needed.

    Raises BagError naming the type when no definition can be found.
    """
    msgtype = normalize_msgtype(msgtype)
    pending = [msgtype]
    loaded: dict = {}
    while pending:
        name = pending.pop()
        if name in store.fielddefs or name in loaded:
            continue
        pkg, _, short = name.split("/")
        for share in _share_dirs():
            path = share / pkg / "msg" / f"{short}.msg"
            if path.is_file():
                typs = get_types_from_msg(path.read_text(), name)
                loaded.update(typs)
                for _, fields in typs.values():
                    for _, (nodetype, detail) in fields:
                        ref = _name_in(nodetype, detail)
                        if ref and ref not in store.fielddefs and ref not in loaded:
                            pending.append(ref)
                break
        else:
            raise BagError(
                f"unknown message type {name}: not in the typestore and no {pkg}/msg/{short}.msg "
                f"under {[str(s) for s in _share_dirs()]}"
            )
    if loaded:
        store.register(loaded)


def _name_in(nodetype: Any, detail: Any) -> str | None:
    """The message type a field refers to (directly or as array/sequence element), else None."""
    nt = int(nodetype)
    if nt == 2:
        return detail
    if nt in (3, 4):
        (sub_nt, sub_detail), _ = detail
        return _name_in(sub_nt, sub_detail)
    return None


@lru_cache(maxsize=1)
def typestore() -> Typestore:
    """The shared typestore: ROS 2 Kilted standard messages + rad2_msgs (from the .msg files)."""
    store = get_typestore(TYPESTORE_DISTRO)
    store.register(_types_from_msg_dir(RAD2_MSGS_PACKAGE, rad2_msgs_dir()))
    return store


def new_message(msgtype: str, store: Typestore | None = None, **fields: Any) -> Any:
    """A message of ``msgtype`` with every field default-initialised (zeros, '', empty), then ``fields``.

    Primitive arrays/sequences are numpy arrays (rosbags' convention); nested messages recurse.
    """
    store = store or typestore()
    msgtype = normalize_msgtype(msgtype)
    ensure_type(store, msgtype)
    _, fielddefs = store.fielddefs[msgtype]
    values: dict[str, Any] = {}
    for name, (nodetype, detail) in fielddefs:
        if name in fields:
            values[name] = fields.pop(name)
        else:
            values[name] = _default_value(store, nodetype, detail)
    if fields:
        raise BagError(f"{msgtype} has no field(s) {sorted(fields)}")
    return store.types[msgtype](**values)


def _default_value(store: Typestore, nodetype: Any, detail: Any) -> Any:
    nt = int(nodetype)
    if nt == 1:  # BASE
        base = detail[0]
        if base == "string" or base == "wstring":
            return ""
        if base == "bool":
            return False
        if base.startswith("float"):
            return 0.0
        return 0
    if nt == 2:  # NAME
        return new_message(detail, store)
    (sub_nt, sub_detail), size = detail
    if int(sub_nt) == 1 and sub_detail[0] in _PRIMITIVE_DTYPES:
        return np.zeros(size if nt == 3 else 0, dtype=_PRIMITIVE_DTYPES[sub_detail[0]])
    if nt == 3:  # fixed-size array of strings / messages
        return [_default_value(store, sub_nt, sub_detail) for _ in range(size)]
    return []


def ns_to_time(ns: int, store: Typestore | None = None) -> Any:
    """Nanoseconds -> ``builtin_interfaces/msg/Time``."""
    store = store or typestore()
    ns = int(ns)
    return store.types["builtin_interfaces/msg/Time"](sec=ns // 1_000_000_000, nanosec=ns % 1_000_000_000)


def time_to_ns(stamp: Any) -> int:
    """``builtin_interfaces/msg/Time`` (rosbags, rclpy or mcap_ros2 object) -> nanoseconds."""
    return int(stamp.sec) * 1_000_000_000 + int(stamp.nanosec)


def planning_diagnostics_record(msg: Any) -> dict[str, Any]:
    """A plain dict of one ``rad2_msgs/PlanningDiagnostics`` (rosbags, rclpy or mcap_ros2 object):
    ``stages`` (name -> ms, in order) and every other field under its message name; no validation
    (``ros_conversions.planning_diagnostics_from_msg`` validates and then uses this)."""
    return {
        "stamp_ns": time_to_ns(msg.header.stamp),
        "input_stamp_ns": time_to_ns(msg.input_stamp),
        "node": str(msg.node),
        "backend": str(msg.backend),
        "stages": {str(s.name): float(s.milliseconds) for s in msg.stages},
        "total_ms": float(msg.total_ms),
        "end_to_end_ms": float(msg.end_to_end_ms),
        "deadline_missed": bool(msg.deadline_missed),
        "cycle_count": int(msg.cycle_count),
        "deadline_miss_count": int(msg.deadline_miss_count),
        "rejected_input_count": int(msg.rejected_input_count),
        "fallback_active": bool(msg.fallback_active),
        "fallback_reason": str(msg.fallback_reason),
    }


def header(stamp_ns: int, frame_id: str, store: Typestore | None = None) -> Any:
    """A ``std_msgs/msg/Header``."""
    store = store or typestore()
    return store.types["std_msgs/msg/Header"](stamp=ns_to_time(stamp_ns, store), frame_id=frame_id)


def serialize(msg: Any, msgtype: str | None = None, store: Typestore | None = None) -> bytes:
    """CDR bytes of a rosbags message (what rclpy publishes/receives as a serialized message)."""
    store = store or typestore()
    return bytes(store.serialize_cdr(msg, normalize_msgtype(msgtype or msg.__msgtype__)))


def deserialize(data: bytes | memoryview, msgtype: str, store: Typestore | None = None) -> Any:
    """Decode CDR bytes into a rosbags message of ``msgtype``."""
    store = store or typestore()
    msgtype = normalize_msgtype(msgtype)
    ensure_type(store, msgtype)
    try:
        return store.deserialize_cdr(data, msgtype)
    except Exception as exc:  # rosbags raises assorted errors (struct, index) on bad data
        raise BagError(f"cannot decode a {msgtype} message ({len(data)} bytes): {exc}") from exc


