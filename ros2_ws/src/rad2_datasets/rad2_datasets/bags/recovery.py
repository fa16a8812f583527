"""Recovery of bags whose writer died: every complete MCAP record read sequentially and written again as
a valid bag (``recover_bag``; the CLI ``rad2 data repair-bag``).
"""

from __future__ import annotations

import io
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rosbags.rosbag2 import Reader
from rosbags.rosbag2.metadata import parse_qos
from rosbags.typesys.store import Typestore

from rad2_datasets.bags.messages import _MCAP_MAGIC, DAMAGED_SUFFIX, META_PREFIX, BagError
from rad2_datasets.bags.writer import BagWriter

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


@dataclass(frozen=True)
class McapStatistics:
    """What a finished MCAP file's summary says it holds."""

    per_topic: dict[str, int]  # messages per topic (topics without messages left out)
    message_count: int
    start_ns: int  # log time of the first message
    end_ns: int  # log time of the last message


def mcap_statistics(path: str | os.PathLike) -> McapStatistics | None:
    """The summary statistics of the MCAP file ``path`` (None when its summary has none); errors of the
    mcap reader (no summary, a damaged one) propagate."""
    from mcap.reader import make_reader

    with Path(path).open("rb") as f:
        summary = make_reader(f).get_summary()
    stats = summary.statistics if summary is not None else None
    if stats is None:
        return None
    per_topic: dict[str, int] = {}
    for cid, n in stats.channel_message_counts.items():
        if n:
            topic = summary.channels[cid].topic
            per_topic[topic] = per_topic.get(topic, 0) + n
    return McapStatistics(per_topic, int(stats.message_count), int(stats.message_start_time),
                          int(stats.message_end_time))


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
        try:
            # what metadata.yaml says (rosbags' Reader reads it as written; rad2's BagReader would
            # answer from the MCAP's own statistics instead)
            with Reader(bag_dir) as reader:
                counts = {}
                for conn in reader.connections:
                    counts[conn.topic] = counts.get(conn.topic, 0) + conn.msgcount
                first, last = reader.start_time, reader.end_time - 1
                total = reader.message_count
            stats = mcap_statistics(src)
            consistent = (stats is not None and stats.message_count == total == sum(counts.values())
                          and stats.per_topic == {t: n for t, n in counts.items() if n})
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
