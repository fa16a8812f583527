"""Rosbag2 (MCAP storage) reading and writing for rad2, without rclpy.

Built on ``rosbags``: a typestore holding the ROS 2 Kilted standard messages plus ``rad2_msgs``
registered from the ``.msg`` files in ``ros2_ws/src/rad2_msgs/msg`` (so it works without a colcon build),
and small writer/reader helpers for rosbag2 directories (``metadata.yaml`` + ``<name>_0.mcap``).

Bags written here embed every schema as ``ros2msg`` text in the MCAP file, so Foxglove and the
``mcap`` + ``mcap_ros2`` readers decode them without any ROS installation. Types the typestore does
not know yet (recorded from a live graph) are loaded from the ``share/<pkg>/msg/*.msg`` files of the
ament prefixes (``$AMENT_PREFIX_PATH`` and the Python prefix).

Serialized payloads are plain CDR (4-byte encapsulation header first): the bytes ``rclpy`` gives a
``raw=True`` subscription and takes in ``publish`` of a serialized message are the same bytes.

Crash safety: a ``BagWriter`` given ``chunk_duration_s`` closes its MCAP chunk at least that often
and writes it together with a complete summary and footer, fsynced, then replaces ``metadata.yaml``:
after every chunk the bag is a finished one, so a writer killed outright (SIGKILL) leaves a bag that
opens as it is in this project's readers and in any MCAP reader (Foxglove's ``mcap`` package),
missing at most the chunk in progress. A bag without footer or ``metadata.yaml`` (a kill inside the
one write of a chunk, a bag of another writer that died) is repaired on open by ``BagReader``
with ``recover_bag`` (also the CLI ``rad2 data repair-bag``), which reads every complete record
sequentially and rewrites a valid bag.
"""

from __future__ import annotations

import functools
import io
import os
import struct
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Self

import numpy as np
from rosbags.rosbag2 import Reader, ReaderError, StoragePlugin, Writer, WriterError
from rosbags.rosbag2.metadata import parse_qos
from rosbags.rosbag2.storage_mcap import McapWriter
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
#: Clock of the chunk deadlines (module level so tests can drive it deterministically).
_monotonic = time.monotonic

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


class _OffsetBuffer(io.BytesIO):
    """Bytes collected in memory that report file offsets from ``base``: rosbags' MCAP writer records
    chunk, index and summary positions with ``tell()``, so records composed here carry the offsets
    they will have in the file. ``close`` leaves the bytes readable."""

    def __init__(self, base: int):
        super().__init__()
        self.base = int(base)

    def tell(self) -> int:
        return self.base + super().tell()

    def close(self) -> None:
        pass


class _DurableMcapStorage(McapWriter):
    """rosbags' MCAP storage, plus: the pending chunk is closed once ``chunk_duration_s`` (wall time)
    has passed since the last message already on disk was written, and every closed chunk goes to
    the file together with a complete summary and footer, so the file is a finished MCAP after every
    chunk: a writer killed outright (SIGKILL) leaves a bag that opens as it is, in this project's
    readers and in any MCAP reader, missing at most the messages of the last ``chunk_duration_s``.

    How: the chunk, the rosbag2 metadata record, DataEnd, the summary (schemas, channels, chunk
    indexes, statistics, offsets), the footer and the closing magic are composed in memory with their
    file offsets (``_OffsetBuffer``) and written with one ``os.pwrite`` at the end of the data
    section, over the previous summary, then fsynced; ``checkpointed`` (BagWriter) then replaces
    metadata.yaml atomically. Only a kill inside that one write (a millisecond per chunk) leaves a
    damaged tail, which ``BagReader`` repairs on open (``recover_bag``). The age counts from the last
    synced message, not from the pending chunk's first one, so neither the publish period nor a late
    loop iteration adds to the bound; after a silence the next message is synced at once. rosbags
    still closes a chunk at 1 MiB; those chunks are written the same way. Without ``chunk_duration_s``
    (offline writers) this is rosbags' storage as it is: one summary at close.
    """

    def __init__(self, path: Path, compression: Any, *, chunk_duration_s: float | None) -> None:
        super().__init__(path, compression)
        self.chunk_duration_s = chunk_duration_s
        self.last_write = _monotonic()
        self.last_sync = self.last_write  # when the newest message on disk was written
        self.synced_chunks = 0
        self.version = ROSBAG2_VERSION
        #: () -> (embedded rosbag2 metadata text, callable that puts metadata.yaml in place) of the bag
        #: as it will be after the next checkpoint; set by BagWriter
        self.metadata_source: Any = None
        self.bio.flush()
        self._data_end = self.bio.tell()  # where the summary of the last checkpoint begins
        self._in_write = False
        self._unwritten = b""  # a chunk closed inside a write, written once the message is counted

    def write(self, connection: Any, timestamp: int, data: bytes | memoryview) -> None:
        self.last_write = _monotonic()
        self._in_write = True
        try:
            super().write(connection, timestamp, data)
        finally:
            self._in_write = False

    def after_write(self) -> None:
        """Called by BagWriter once rosbags' Writer has counted the message just written (metadata.yaml
        must describe it): write a chunk closed during the write, or close one that is due."""
        if self._unwritten:
            data, self._unwritten = self._unwritten, b""
            self.checkpoint(data)
        else:
            self.flush_if_due()

    def close_chunk(self) -> None:
        if self.chunk_duration_s is None:
            super().close_chunk()
            return
        real, buf = self.bio, _OffsetBuffer(self._data_end + len(self._unwritten))
        self.bio = buf
        try:
            super().close_chunk()
        finally:
            self.bio = real
        self._unwritten += buf.getvalue()
        if not self._in_write:
            data, self._unwritten = self._unwritten, b""
            self.checkpoint(data)

    def checkpoint(self, data: bytes = b"") -> None:
        """Write ``data`` (closed chunks and their indexes) at the end of the data section followed by
        a summary and footer of everything written so far, in one write; fsync; then metadata.yaml."""
        embedded, publish_metadata = self.metadata_source() if self.metadata_source else ("", None)
        end = self._data_end + len(data)
        tail = _OffsetBuffer(end)
        real, self.bio = self.bio, tail
        try:  # rosbags' own summary writer, onto the buffer (the pending chunk is empty here)
            McapWriter.close(self, self.version, embedded)
        finally:
            self.bio = real
        blob = data + tail.getvalue()
        fd = self.bio.fileno()
        view, at = memoryview(blob), self._data_end
        while view:
            n = os.pwrite(fd, view, at)
            view, at = view[n:], at + n
        os.ftruncate(fd, self._data_end + len(blob))
        os.fsync(fd)
        self._data_end = end
        self.bio.seek(end)
        self.last_sync = self.last_write
        self.synced_chunks += 1 if data else 0
        if publish_metadata is not None:
            publish_metadata()

    def flush_if_due(self, now: float | None = None) -> bool:
        """Close and write the pending chunk once chunk_duration_s passed since the newest message on
        disk was written."""
        if self.chunk_duration_s is None or not self.chunk.msgs:
            return False
        now = _monotonic() if now is None else now
        if now - self.last_sync < self.chunk_duration_s:
            return False
        self.close_chunk()
        return True

    def close(self, version: int, metadata: str) -> None:
        if self.chunk_duration_s is None:
            super().close(version, metadata)
            return
        self.version = version
        if self.chunk.msgs:
            self.close_chunk()
        source, self.metadata_source = self.metadata_source, lambda: (metadata, None)
        try:
            self.checkpoint()  # the final summary, with the final metadata record
        finally:
            self.metadata_source = source
        self.bio.close()


class BagWriter(_OpenedInWith):
    """Write a rosbag2 directory with MCAP storage; use as a context manager.

    ``write(topic, msg, stamp_ns)`` takes a rosbags message (or CDR ``bytes`` with ``msgtype=``);
    connections are added on first use with the schema from the typestore. ``set_metadata`` stores
    strings in ``metadata.yaml`` ``custom_data`` (keys get the ``rad2.`` prefix).

    ``chunk_duration_s`` (a live recorder passes ``recording.chunk_duration_s`` of params/nodes.yaml):
    every MCAP chunk is closed, flushed and fsynced after at most that long (checked on each write and
    on ``flush_if_due()``, which a recorder calls while idle), so a writer that dies loses at most
    the chunk in progress; ``recover_bag`` repairs what it leaves. ``None``: chunks close at 1 MiB only.
    """

    def __init__(self, path: str | os.PathLike, *, overwrite: bool = False, store: Typestore | None = None,
                 chunk_duration_s: float | None = None):
        self.path = Path(path)
        self.store = store or typestore()
        if chunk_duration_s is not None and not chunk_duration_s > 0:
            raise BagError(f"{self.path}: chunk_duration_s must be positive, got {chunk_duration_s}")
        self.chunk_duration_s = chunk_duration_s
        if self.path.exists():
            if not overwrite:
                raise BagError(f"{self.path} exists already (pass overwrite / --force to replace it)")
            _remove_bag_dir(self.path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._writer = Writer(self.path, version=ROSBAG2_VERSION, storage_plugin=StoragePlugin.MCAP)
        # rosbags picks the storage class from this mapping in open(); an instance attribute swaps in
        # the durable MCAP storage for this writer only.
        self._writer.STORAGE_PLUGINS = {
            StoragePlugin.MCAP: functools.partial(_DurableMcapStorage, chunk_duration_s=chunk_duration_s)}
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
        storage = self._writer.storage
        if isinstance(storage, _DurableMcapStorage) and storage.chunk_duration_s is not None:
            storage.metadata_source = self._pending_metadata
            storage.checkpoint()  # an empty bag that opens, from the first moment

    def _pending_metadata(self) -> tuple[str, Any]:
        """(the rosbag2 metadata text embedded in the MCAP, a callable that puts metadata.yaml in place)
        for the bag as written so far. rosbags' own ``Writer.close`` composes both: it runs here against
        a storage stand-in that keeps the embedded text, with metadata.yaml directed to a pending file
        that the callable moves over metadata.yaml once the MCAP holds what it describes."""
        writer, real = self._writer, self._writer.storage
        pending = self.path / ".metadata.pending.yaml"
        captured: dict[str, str] = {}

        class _Capture:
            path = real.path

            def close(self, version: int, text: str) -> None:
                captured["text"] = text

        metapath = writer.metapath
        writer.storage, writer.metapath = _Capture(), pending
        try:
            writer.close()
        finally:
            writer.storage, writer.metapath = real, metapath
        return captured.get("text", ""), lambda: os.replace(pending, metapath)

    def close(self) -> None:
        if self._open:
            self._writer.close()
            self._open = False

    def set_metadata(self, key: str, value: Any) -> None:
        """Store ``value`` (converted to str) under ``rad2.<key>`` in metadata.yaml custom_data."""
        self._writer.set_custom_data(META_PREFIX + key, str(value))

    def flush_if_due(self) -> bool:
        """Close, flush and fsync the chunk in progress if it is ``chunk_duration_s`` old (True if so).

        A recorder calls this while waiting for messages, so an idle topic cannot keep a chunk
        (and the data in it) in memory indefinitely."""
        storage = self._writer.storage
        if not self._open or not isinstance(storage, _DurableMcapStorage):
            return False
        return storage.flush_if_due()

    @property
    def synced_chunks(self) -> int:
        """Chunks flushed and fsynced so far."""
        storage = self._writer.storage
        return storage.synced_chunks if isinstance(storage, _DurableMcapStorage) else 0

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

    def _add_topic_with_definition(self, topic: str, msgtype: str, msgdef: str,
                                   qos_profiles: Iterable[Any] = ()) -> None:
        """Declare ``topic`` with the definition text a bag carried (recovery keeps it verbatim, so
        types this typestore does not know survive). The type is registered from that text when
        the typestore lacks it, to compute the rosbag2 type hash."""
        msgtype = normalize_msgtype(msgtype)
        if topic in self._connections:
            if self._types[topic] != msgtype:
                raise BagError(f"topic {topic} already recorded as {self._types[topic]}, not {msgtype}")
            return
        if msgtype not in self.store.fielddefs:
            try:
                self.store.register(get_types_from_msg(msgdef, msgtype))
            except Exception:
                ensure_type(self.store, msgtype)  # BagError naming the type when nothing defines it
        self._connections[topic] = self._writer.add_connection(
            topic, msgtype, msgdef=msgdef, rihs01=self.store.hash_rihs01(msgtype),
            offered_qos_profiles=list(qos_profiles))
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
        storage = self._writer.storage
        if isinstance(storage, _DurableMcapStorage) and storage.chunk_duration_s is not None:
            storage.after_write()


def _remove_bag_dir(path: Path) -> None:
    """Remove an existing bag directory (only files a bag holds; refuse anything else)."""
    if path.is_file():
        raise BagError(f"{path} is a file, not a bag directory; refusing to replace it")
    allowed = {".mcap", ".yaml", ".db3", ".zstd", ".json", ".png", DAMAGED_SUFFIX}
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
        mcaps = sorted(c.name for c in p.glob("*.mcap"))
        if mcaps:
            raise BagError(
                f"{p} is not a complete rosbag2 directory: it holds {mcaps} but no metadata.yaml (its "
                f"recorder probably died before closing it); recover it with: {REPAIR_COMMAND} {p}")
        raise BagError(f"{p} is not a rosbag2 directory (no metadata.yaml)")
    return p


def mcap_is_complete(path: str | os.PathLike) -> bool:
    """Whether an MCAP file ends with its footer and closing magic (False: its writer never finished)."""
    path = Path(path)
    size = path.stat().st_size
    if size < 2 * len(_MCAP_MAGIC) + 29:
        return False
    with path.open("rb") as f:
        f.seek(size - 37)
        tail = f.read(37)
    return tail[:1] == b"\x02" and tail[-8:] == _MCAP_MAGIC


def _repair_hint(path: Path) -> str:
    """' ...; recover it with rad2 data repair-bag' when ``path`` holds an unfinished MCAP file, else ''."""
    files = [path] if path.is_file() else sorted(path.glob("*.mcap"))
    unfinished = [f.name for f in files if f.suffix == ".mcap" and f.is_file() and not mcap_is_complete(f)]
    if not unfinished:
        return ""
    return (f"; {unfinished} has no MCAP summary/footer (its writer died before closing it): "
            f"recover it with: {REPAIR_COMMAND} {path}")


def _unfinished(path: Path) -> bool:
    """Whether ``path`` (a bag directory or an .mcap file) holds one MCAP file whose writer did not
    finish it: no footer, or no metadata.yaml beside it."""
    p = Path(path)
    if p.is_file():
        return p.suffix == ".mcap" and not mcap_is_complete(p)
    mcaps = sorted(c for c in p.glob("*.mcap") if c.is_file()) if p.is_dir() else []
    return len(mcaps) == 1 and (not mcap_is_complete(mcaps[0]) or not (p / "metadata.yaml").is_file())


class BagReader(_OpenedInWith):
    """Read a rosbag2 directory (MCAP or sqlite3 storage); use as a context manager.

    Decodes with the rad2 typestore; types it lacks are registered from the definitions the bag
    carries. Every failure (missing, corrupt, truncated, unknown topic) raises BagError.

    ``repair`` (default): a bag whose writer died before finishing it (an MCAP without footer, or no
    metadata.yaml: a recorder killed inside its one write per chunk, or a bag of an older writer) is
    repaired on open with ``recover_bag`` (the damaged originals kept beside it, ``repaired`` holds
    the report); False raises BagError naming the repair command instead. Bags of this project's
    live recorder open without it: every chunk is written with its summary and metadata.yaml.
    """

    def __init__(self, path: str | os.PathLike, *, store: Typestore | None = None, repair: bool = True):
        self.repaired: RecoveryReport | None = None
        if repair and Path(path).exists() and _unfinished(Path(path)):
            try:
                self.repaired = recover_bag(path, store=store)
            except (BagError, OSError) as exc:
                raise BagError(f"cannot read bag {path}: its writer did not finish it, and repairing it "
                               f"failed ({exc}){_repair_hint(Path(path))}") from exc
        self.path = resolve_bag_path(path)
        self.store = store or typestore()
        try:
            self._reader = Reader(self.path)
        except ReaderError as exc:
            raise BagError(f"cannot read bag {self.path}: {exc}{_repair_hint(self.path)}") from exc
        except Exception as exc:  # malformed metadata.yaml surfaces as yaml/key errors
            raise BagError(f"cannot read bag {self.path} (bad metadata.yaml?): {exc}"
                           f"{_repair_hint(self.path)}") from exc
        self._opened = False

    def open(self) -> None:
        try:
            self._reader.open()
        except Exception as exc:
            raise BagError(
                f"cannot open bag {self.path} (corrupt or truncated storage file?): {exc}"
                f"{_repair_hint(self.path)}"
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



# --------------------------------------------------------------------------------------------------
# Recovery of bags whose writer died
# --------------------------------------------------------------------------------------------------

_OP_CHUNK = 0x06
_OP_FOOTER = 0x02


@dataclass
class RecoveryReport:
    """What ``recover_bag`` did. Times are log times in ns; ``lost_*`` describe the end of the
    recording that did not reach the file (only bounded when the file or a stale metadata.yaml
    still says how far the recording went; otherwise ``lost_until_ns`` is None)."""

    bag: Path
    repaired: bool
    damaged_files: list[Path]
    messages: dict[str, int]
    start_ns: int | None
    end_ns: int | None
    file_bytes: int
    recovered_bytes: int
    had_footer: bool
    lost_until_ns: int | None = None
    skipped_messages: int = 0
    stopped_at: str = ""

    @property
    def message_count(self) -> int:
        return sum(self.messages.values())

    @property
    def lost_tail_s(self) -> float | None:
        if self.lost_until_ns is None or self.end_ns is None:
            return None
        return max(0.0, (self.lost_until_ns - self.end_ns) * 1e-9)

    def summary(self) -> str:
        lines = [f"bag {self.bag}: " + ("repaired" if self.repaired else "already complete, left as is")]
        for topic, count in sorted(self.messages.items()):
            lines.append(f"  {topic}: {count} messages")
        if self.start_ns is not None and self.end_ns is not None:
            lines.append(f"  recovered time range: {self.start_ns * 1e-9:.3f} .. {self.end_ns * 1e-9:.3f} s "
                         f"({(self.end_ns - self.start_ns) * 1e-9:.3f} s)")
        else:
            lines.append("  no complete message survived")
        lost_bytes = self.file_bytes - self.recovered_bytes
        if self.repaired:
            if self.lost_tail_s is not None:
                lines.append(f"  lost at the end: {self.lost_tail_s:.3f} s of log time "
                             f"(up to {self.lost_until_ns * 1e-9:.3f} s), "
                             f"{lost_bytes} bytes of partial record")
            else:
                lines.append(f"  lost at the end: everything logged after the recovered range (the chunk in "
                             f"progress when the writer died; its length is not recorded anywhere), "
                             f"{lost_bytes} bytes of partial record")
        if self.skipped_messages:
            lines.append(f"  skipped {self.skipped_messages} messages whose channel definition was lost")
        if self.stopped_at:
            lines.append(f"  reading stopped at: {self.stopped_at}")
        for path in self.damaged_files:
            lines.append(f"  damaged original kept as {path}")
        return "\n".join(lines)


class _PrefixReader(io.RawIOBase):
    """The first ``limit`` bytes of a file: the MCAP stream reader then meets a clean end of data
    exactly after the last complete record instead of parsing a half-written one."""

    def __init__(self, f: Any, limit: int):
        self._f = f
        self._left = limit

    def readable(self) -> bool:
        return True

    def readinto(self, buf: Any) -> int:
        n = min(len(buf), self._left)
        if n <= 0:
            return 0
        data = self._f.read(n)
        buf[: len(data)] = data
        self._left -= len(data)
        return len(data)


def _scan_mcap_records(path: Path) -> tuple[int, bool, int | None, str]:
    """Walk the top-level record framing (opcode u8, length u64) of an MCAP file without parsing.

    Returns (end of the last complete record, footer seen, message end time of a partially written
    chunk when its header survived, why the walk stopped)."""
    size = path.stat().st_size
    with path.open("rb") as f:
        if f.read(len(_MCAP_MAGIC)) != _MCAP_MAGIC:
            raise BagError(f"{path} is not an MCAP file (bad magic)")
        pos = len(_MCAP_MAGIC)
        while pos + 9 <= size:
            f.seek(pos)
            opcode, length = struct.unpack("<BQ", f.read(9))
            if opcode == 0:  # zero-filled tail (a file system that allocated but never wrote it)
                return pos, False, None, f"zero bytes at offset {pos}"
            end = pos + 9 + length
            if end > size:
                partial_end = None
                if opcode == _OP_CHUNK and pos + 9 + 16 <= size:
                    _, partial_end = struct.unpack("<QQ", f.read(16))  # message start/end times
                return pos, False, partial_end, f"record cut off at offset {pos} (opcode {opcode:#04x})"
            pos = end
            if opcode == _OP_FOOTER:
                return pos, True, None, ""
        return pos, False, None, "end of file without footer" if pos == size else f"partial header at {pos}"


def _unique_beside(path: Path) -> Path:
    """``<path>.damaged`` (``<path>.1.damaged``, ... when an earlier recovery left one; the suffix
    stays last so BagWriter(overwrite=True) still recognises the directory as a bag)."""
    cand = path.with_name(path.name + DAMAGED_SUFFIX)
    k = 1
    while cand.exists():
        cand = path.with_name(f"{path.name}.{k}{DAMAGED_SUFFIX}")
        k += 1
    return cand


def _stale_metadata(meta: Path) -> tuple[dict[str, str], int | None]:
    """custom_data and end time (ns) of an existing metadata.yaml; ({}, None) when unreadable."""
    from ruamel.yaml import YAML

    try:
        doc = YAML(typ="safe").load(meta.read_text())["rosbag2_bagfile_information"]
        custom = {str(k): str(v) for k, v in (doc.get("custom_data") or {}).items()}
        start = int(doc["starting_time"]["nanoseconds_since_epoch"])
        duration = int(doc["duration"]["nanoseconds"])
        return custom, (start + duration if int(doc.get("message_count", 0)) else None)
    except Exception:
        return {}, None


def recover_bag(path: str | os.PathLike, *, store: Typestore | None = None) -> RecoveryReport:
    """Repair a rosbag2 MCAP bag whose writer died (MCAP without summary/footer, metadata.yaml
    missing or stale).

    Reads every complete record of the MCAP file with the sequential stream reader (which needs no
    summary), writes a new valid MCAP (summary and index) and a rosbag2 metadata.yaml with matching
    counts and time range, and keeps the damaged MCAP (and a stale metadata.yaml) beside them as
    ``<name>.damaged``. A bag that is already complete is left untouched (``repaired`` False).
    Raises BagError naming the path when it is not an MCAP bag.
    """
    from mcap.exceptions import EndOfFile
    from mcap.records import Channel, Header, Message, Schema
    from mcap.stream_reader import StreamReader

    p = Path(path)
    if not p.exists():
        raise BagError(f"bag {p} does not exist")
    if p.is_file():
        if p.suffix != ".mcap":
            raise BagError(f"{p} is neither a rosbag2 directory nor an .mcap file")
        bag_dir, mcaps = p.parent, [p]
    else:
        bag_dir, mcaps = p, sorted(c for c in p.glob("*.mcap") if c.is_file())
    if not mcaps:
        raise BagError(f"{p} holds no .mcap file: not an MCAP bag (nothing to recover)")
    if len(mcaps) > 1:
        raise BagError(f"{bag_dir} holds several .mcap files {[m.name for m in mcaps]}; recover_bag "
                       f"handles single-file bags (pass one of them)")
    src = mcaps[0]
    meta = bag_dir / "metadata.yaml"
    size = src.stat().st_size
    valid_end, had_footer, partial_end, stopped_at = _scan_mcap_records(src)

    if had_footer and meta.is_file():
        # complete MCAP: repair only when metadata.yaml disagrees with the MCAP's own statistics
        from mcap.reader import make_reader

        try:
            with BagReader(bag_dir, store=store) as reader:
                counts = {t: i.count for t, i in reader.topics.items()}
                first, last = reader.start_time_ns, reader.end_time_ns - 1
                total = reader.message_count
            with src.open("rb") as f:
                summary = make_reader(f).get_summary()
            stats = summary.statistics if summary is not None else None
            in_file: dict[str, int] = {}
            if stats is not None:
                for cid, n in stats.channel_message_counts.items():
                    topic = summary.channels[cid].topic
                    in_file[topic] = in_file.get(topic, 0) + n
            consistent = (stats is not None and stats.message_count == total == sum(counts.values())
                          and in_file == {t: n for t, n in counts.items() if n})
        except Exception:  # BagError, or an MCAP summary the mcap reader rejects: rewrite it
            consistent = False
        if consistent:
            return RecoveryReport(bag_dir, False, [], counts, first if total else None,
                                  last if total else None, size, size, True)

    custom, stale_end = _stale_metadata(meta) if meta.is_file() else ({}, None)
    tmp_root = bag_dir.parent / f".{bag_dir.name}.recovering-{os.getpid()}"
    if tmp_root.exists():
        raise BagError(f"{tmp_root} exists (an interrupted recovery?); remove it and retry")
    tmp_bag = tmp_root / bag_dir.name
    schemas: dict[int, Schema] = {}
    topic_of: dict[int, str] = {}
    counts: dict[str, int] = {}
    skipped = 0
    first_ns: int | None = None
    last_ns: int | None = None
    try:
        writer = BagWriter(tmp_bag, store=store)
        with writer, src.open("rb") as f:
            for key, value in custom.items():
                if key.startswith(META_PREFIX):
                    writer._writer.set_custom_data(key, value)
            records = StreamReader(_PrefixReader(f, size if had_footer else valid_end),
                                   validate_crcs=True).records
            while True:
                try:
                    record = next(records)
                except StopIteration:
                    break
                except EndOfFile:
                    break  # the clean end of the last complete record: the expected end without footer
                except Exception as exc:  # McapError (CRC), zstd/lz4, struct errors on garbage
                    # a complete but corrupt record (bad CRC, undecompressible chunk): keep what came before
                    stopped_at = f"unreadable record after {sum(counts.values())} messages: {exc}"
                    break
                if isinstance(record, Header):
                    if record.profile != "ros2":
                        raise BagError(f"{src} has MCAP profile {record.profile!r}, not a ros2 bag")
                elif isinstance(record, Schema):
                    schemas[record.id] = record
                elif isinstance(record, Channel):
                    if record.id in topic_of:
                        continue  # repeated in the summary of a finished file
                    schema = schemas.get(record.schema_id)
                    if schema is None:
                        continue
                    qos_text = record.metadata.get("offered_qos_profiles", "")
                    try:
                        qos = parse_qos(qos_text) if qos_text else []
                    except Exception:
                        qos = []  # unparsable QoS only loses the QoS, not the messages
                    writer._add_topic_with_definition(record.topic, schema.name, schema.data.decode(), qos)
                    topic_of[record.id] = record.topic
                elif isinstance(record, Message):
                    topic = topic_of.get(record.channel_id)
                    if topic is None:
                        skipped += 1
                        continue
                    writer.write(topic, record.data, record.log_time)
                    counts[topic] = counts.get(topic, 0) + 1
                    first_ns = record.log_time if first_ns is None else min(first_ns, record.log_time)
                    last_ns = record.log_time if last_ns is None else max(last_ns, record.log_time)
        # the new files are complete: only now move the damaged ones aside and put the new ones in place
        damaged = [src.rename(_unique_beside(src))]
        if meta.is_file():
            damaged.append(meta.rename(_unique_beside(meta)))
        for new in sorted(tmp_bag.iterdir()):
            new.rename(bag_dir / new.name)
    finally:
        if tmp_bag.is_dir():
            for leftover in tmp_bag.iterdir():
                leftover.unlink()
            tmp_bag.rmdir()
        if tmp_root.is_dir():
            tmp_root.rmdir()
    # how far the recording went: a half-written chunk's header or a stale metadata.yaml may say;
    # a finished file lost nothing
    lost_until = last_ns if had_footer else max(
        (t for t in (partial_end, stale_end) if t is not None), default=None)
    if lost_until is not None and last_ns is not None:
        lost_until = max(lost_until, last_ns)
    return RecoveryReport(bag_dir, True, damaged, counts, first_ns, last_ns, size,
                          size if had_footer else valid_end, had_footer, lost_until, skipped, stopped_at)
