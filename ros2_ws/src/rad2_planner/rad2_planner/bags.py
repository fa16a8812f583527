"""Rosbag2 (MCAP storage) reading and writing for rad2, without rclpy.

Built on ``rosbags``: a typestore holding the ROS 2 Kilted standard messages plus ``rad2_msgs``
registered from the ``.msg`` files in ``ros2_ws/src/msgs/msg`` (so it works without a colcon build),
and small writer/reader helpers for rosbag2 directories (``metadata.yaml`` + ``<name>_0.mcap``).

Bags written here embed every schema as ``ros2msg`` text in the MCAP file, so Foxglove and the
``mcap`` + ``mcap_ros2`` readers decode them without any ROS installation. Types the typestore does
not know yet (recorded from a live graph) are loaded from the ``share/<pkg>/msg/*.msg`` files of the
ament prefixes (``$AMENT_PREFIX_PATH`` and the Python prefix).

Serialized payloads are plain CDR (4-byte encapsulation header first): the bytes ``rclpy`` gives a
``raw=True`` subscription and takes in ``publish`` of a serialized message are the same bytes.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Self

import numpy as np
from rosbags.rosbag2 import Reader, ReaderError, StoragePlugin, Writer, WriterError
from rosbags.typesys import Stores, get_types_from_msg, get_typestore
from rosbags.typesys.store import Typestore

RAD2_MSGS_PACKAGE = "rad2_msgs"
TYPESTORE_DISTRO = Stores.ROS2_KILTED
ROSBAG2_VERSION = 9
#: Prefix of the rad2 keys in ``metadata.yaml`` ``custom_data``.
META_PREFIX = "rad2."

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

    ``$RAD2_MSGS_DIR`` if set, else the source tree (``ros2_ws/src/msgs/msg``), else an installed
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
    raise BagError("cannot find the rad2_msgs .msg files; set RAD2_MSGS_DIR to ros2_ws/src/msgs/msg")


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


# --------------------------------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------------------------------


class _OpenedInWith:
    """``with bag:`` calls ``open()`` on entry and ``close()`` on exit."""

    def __enter__(self) -> Self:
        self.open()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class BagWriter(_OpenedInWith):
    """Write a rosbag2 directory with MCAP storage; use as a context manager.

    ``write(topic, msg, stamp_ns)`` takes a rosbags message (or CDR ``bytes`` with ``msgtype=``);
    connections are added on first use with the schema from the typestore. ``set_metadata`` stores
    strings in ``metadata.yaml`` ``custom_data`` (keys get the ``rad2.`` prefix).
    """

    def __init__(self, path: str | os.PathLike, *, overwrite: bool = False, store: Typestore | None = None):
        self.path = Path(path)
        self.store = store or typestore()
        if self.path.exists():
            if not overwrite:
                raise BagError(f"{self.path} exists already (pass overwrite / --force to replace it)")
            _remove_bag_dir(self.path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._writer = Writer(self.path, version=ROSBAG2_VERSION, storage_plugin=StoragePlugin.MCAP)
        self._connections: dict[str, Any] = {}
        self._types: dict[str, str] = {}
        self.counts: dict[str, int] = {}
        self._open = False

    def open(self) -> None:
        try:
            self._writer.open()
        except WriterError as exc:
            raise BagError(f"cannot create bag {self.path}: {exc}") from exc
        self._open = True

    def close(self) -> None:
        if self._open:
            self._writer.close()
            self._open = False

    def set_metadata(self, key: str, value: Any) -> None:
        """Store ``value`` (converted to str) under ``rad2.<key>`` in metadata.yaml custom_data."""
        self._writer.set_custom_data(META_PREFIX + key, str(value))

    def add_topic(self, topic: str, msgtype: str, *, qos_profiles: Iterable[Any] = ()) -> None:
        """Declare ``topic`` with ``msgtype`` (done implicitly by ``write``)."""
        if not self._open:
            raise BagError(f"bag {self.path} is not open")
        msgtype = normalize_msgtype(msgtype)
        if topic in self._connections:
            if self._types[topic] != msgtype:
                raise BagError(f"topic {topic} already recorded as {self._types[topic]}, not {msgtype}")
            return
        ensure_type(self.store, msgtype)
        self._connections[topic] = self._writer.add_connection(
            topic, msgtype, typestore=self.store, offered_qos_profiles=list(qos_profiles)
        )
        self._types[topic] = msgtype
        self.counts[topic] = 0

    def write(self, topic: str, msg: Any, stamp_ns: int, *, msgtype: str | None = None) -> None:
        """Write one message (rosbags object, or CDR bytes with ``msgtype``) at log time ``stamp_ns``."""
        if isinstance(msg, (bytes, bytearray, memoryview)):
            if msgtype is None and topic not in self._types:
                raise BagError(f"writing raw bytes on new topic {topic} needs msgtype=")
            data = bytes(msg)
            mtype = normalize_msgtype(msgtype) if msgtype else self._types[topic]
        else:
            mtype = normalize_msgtype(msgtype or msg.__msgtype__)
            data = None
        self.add_topic(topic, mtype)
        if data is None:
            data = serialize(msg, mtype, self.store)
        self._writer.write(self._connections[topic], int(stamp_ns), data)
        self.counts[topic] += 1


def _remove_bag_dir(path: Path) -> None:
    """Remove an existing bag directory (only files a bag holds; refuse anything else)."""
    if path.is_file():
        raise BagError(f"{path} is a file, not a bag directory; refusing to replace it")
    allowed = {".mcap", ".yaml", ".db3", ".zstd", ".json", ".png"}
    for child in path.iterdir():
        if child.is_dir() or child.suffix not in allowed:
            raise BagError(f"{path} holds {child.name}, which is not part of a bag; refusing to replace it")
    for child in path.iterdir():
        child.unlink()
    path.rmdir()


# --------------------------------------------------------------------------------------------------
# Reading
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TopicInfo:
    msgtype: str
    count: int


@dataclass
class BagMessage:
    """One message from a bag: ``msg`` is a decoded rosbags object, or CDR bytes when read raw."""

    topic: str
    msgtype: str
    log_time_ns: int
    msg: Any


def resolve_bag_path(path: str | os.PathLike) -> Path:
    """A rosbag2 directory from a directory or one of its files (or a bare .mcap file); BagError otherwise."""
    p = Path(path)
    if not p.exists():
        raise BagError(f"bag {p} does not exist")
    if p.is_file():
        if p.name == "metadata.yaml" or (p.parent / "metadata.yaml").is_file():
            p = p.parent
        elif p.suffix == ".mcap":
            return p  # a bare MCAP file (no rosbag2 metadata): rosbags reads it directly
        else:
            raise BagError(f"{p} is neither a rosbag2 directory nor an .mcap file")
    if not (p / "metadata.yaml").is_file():
        raise BagError(f"{p} is not a rosbag2 directory (no metadata.yaml)")
    return p


class BagReader(_OpenedInWith):
    """Read a rosbag2 directory (MCAP or sqlite3 storage); use as a context manager.

    Decodes with the rad2 typestore; types it lacks are registered from the definitions the bag
    carries. Every failure (missing, corrupt, truncated, unknown topic) raises BagError.
    """

    def __init__(self, path: str | os.PathLike, *, store: Typestore | None = None):
        self.path = resolve_bag_path(path)
        self.store = store or typestore()
        try:
            self._reader = Reader(self.path)
        except ReaderError as exc:
            raise BagError(f"cannot read bag {self.path}: {exc}") from exc
        except Exception as exc:  # malformed metadata.yaml surfaces as yaml/key errors
            raise BagError(f"cannot read bag {self.path} (bad metadata.yaml?): {exc}") from exc
        self._opened = False

    def open(self) -> None:
        try:
            self._reader.open()
        except Exception as exc:
            raise BagError(
                f"cannot open bag {self.path} (corrupt or truncated storage file?): {exc}"
            ) from exc
        self._opened = True
        for conn in self._reader.connections:
            if conn.msgtype not in self.store.fielddefs:
                self._register_from_bag(conn)

    def close(self) -> None:
        if self._opened:
            self._reader.close()
            self._opened = False

    def _register_from_bag(self, conn: Any) -> None:
        data = conn.msgdef.data if conn.msgdef else ""
        try:
            if data and not data.startswith("=" * 80 + "\nIDL: "):
                self.store.register(get_types_from_msg(data, conn.msgtype))
                return
        except Exception:
            pass
        try:
            ensure_type(self.store, conn.msgtype)
        except BagError:
            pass  # reported when a message of that type is decoded

    @property
    def topics(self) -> dict[str, TopicInfo]:
        out: dict[str, TopicInfo] = {}
        for conn in self._reader.connections:
            prev = out.get(conn.topic)
            out[conn.topic] = TopicInfo(conn.msgtype, conn.msgcount + (prev.count if prev else 0))
        return out

    @property
    def custom_data(self) -> dict[str, str]:
        """The rad2 metadata (``rad2.`` keys of custom_data, prefix stripped)."""
        meta = getattr(self._reader.storage, "metadata", None)
        raw = getattr(meta, "custom", None) or {}
        return {k[len(META_PREFIX):]: v for k, v in raw.items() if k.startswith(META_PREFIX)}

    @property
    def message_count(self) -> int:
        return self._reader.message_count

    @property
    def start_time_ns(self) -> int:
        return self._reader.start_time

    @property
    def end_time_ns(self) -> int:
        return self._reader.end_time

    def check_topics(self, topics: Iterable[str]) -> list[str]:
        """The topics, checked to exist in the bag (BagError listing what the bag holds)."""
        topics = list(topics)
        have = self.topics
        missing = [t for t in topics if t not in have]
        if missing:
            raise BagError(f"bag {self.path} has no topic(s) {missing}; it holds {sorted(have)}")
        return topics

    def messages(self, topics: Iterable[str] | None = None, *, raw: bool = False) -> Iterator[BagMessage]:
        """Messages in log-time order, optionally only ``topics`` (each must exist in the bag)."""
        if not self._opened:
            raise BagError(f"bag {self.path} is not open")
        conns = self._reader.connections
        if topics is not None:
            wanted = set(self.check_topics(topics))
            conns = [c for c in conns if c.topic in wanted]
        try:
            for conn, stamp, data in self._reader.messages(connections=conns):
                msg = data if raw else deserialize(data, conn.msgtype, self.store)
                yield BagMessage(conn.topic, conn.msgtype, int(stamp), msg)
        except BagError:
            raise
        except Exception as exc:
            raise BagError(f"error reading bag {self.path} (corrupt or truncated?): {exc}") from exc

