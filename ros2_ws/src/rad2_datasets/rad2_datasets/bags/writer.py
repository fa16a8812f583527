"""Writing rosbag2 directories with MCAP storage: ``BagWriter`` and the crash-safe chunk storage (each
chunk written with a complete summary and footer, fsynced, then ``metadata.yaml`` replaced).
"""

from __future__ import annotations

import functools
import io
import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Self

from rosbags.rosbag2 import StoragePlugin, Writer, WriterError
from rosbags.rosbag2.storage_mcap import McapWriter
from rosbags.typesys import get_types_from_msg
from rosbags.typesys.store import Typestore

from rad2_datasets.bags.messages import (
    DAMAGED_SUFFIX,
    META_PREFIX,
    ROSBAG2_VERSION,
    BagError,
    ensure_type,
    normalize_msgtype,
    serialize,
    typestore,
)

# --------------------------------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------------------------------


#: Clock of the chunk deadlines (module level so tests can drive it deterministically).
_monotonic = time.monotonic


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


