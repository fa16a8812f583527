"""Reading rosbag2 directories (MCAP or SQLite storage): ``BagReader``, topics and messages; a bag whose
writer died is repaired on open (``rad2_datasets.bags.recovery``).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rosbags.rosbag2 import Reader, ReaderError
from rosbags.typesys import get_types_from_msg
from rosbags.typesys.store import Typestore

from rad2_datasets.bags.messages import (
    _MCAP_MAGIC,
    META_PREFIX,
    REPAIR_COMMAND,
    BagError,
    deserialize,
    ensure_type,
    typestore,
)
from rad2_datasets.bags.recovery import McapStatistics, RecoveryReport, mcap_statistics, recover_bag
from rad2_datasets.bags.writer import _OpenedInWith

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
        self._mcap_stats: McapStatistics | None = None

    def open(self) -> None:
        try:
            self._reader.open()
        except Exception as exc:
            raise BagError(
                f"cannot open bag {self.path} (corrupt or truncated storage file?): {exc}"
                f"{_repair_hint(self.path)}"
            ) from exc
        self._opened = True
        self._mcap_stats = self._mcap_statistics()
        for conn in self._reader.connections:
            if conn.msgtype not in self.store.fielddefs:
                self._register_from_bag(conn)

    def _mcap_statistics(self) -> McapStatistics | None:
        """The summary statistics of the bag's one finished MCAP file, or None (SQLite storage, several
        files, no statistics, an unreadable summary: metadata.yaml stays the answer).

        Why: metadata.yaml is replaced just after each chunk reaches the MCAP; a recorder killed between
        the two leaves a metadata.yaml one chunk behind the file. The file's own statistics describe
        exactly the messages ``messages()`` yields, so counts and time range are taken from them."""
        mcaps = ([self.path] if self.path.is_file() else sorted(c for c in self.path.glob("*.mcap")
                                                                  if c.is_file()))
        if len(mcaps) != 1 or mcaps[0].suffix != ".mcap" or not mcap_is_complete(mcaps[0]):
            return None
        try:
            return mcap_statistics(mcaps[0])
        except Exception:
            return None

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
        stats = self._mcap_stats
        if stats is not None:
            out = {t: TopicInfo(i.msgtype, stats.per_topic.get(t, 0)) for t, i in out.items()}
        return out

    @property
    def custom_data(self) -> dict[str, str]:
        """The rad2 metadata (``rad2.`` keys of custom_data, prefix stripped)."""
        meta = getattr(self._reader.storage, "metadata", None)
        raw = getattr(meta, "custom", None) or {}
        return {k[len(META_PREFIX):]: v for k, v in raw.items() if k.startswith(META_PREFIX)}

    @property
    def message_count(self) -> int:
        stats = self._mcap_stats
        return stats.message_count if stats is not None else self._reader.message_count

    @property
    def start_time_ns(self) -> int:
        stats = self._mcap_stats
        return stats.start_ns if stats is not None and stats.message_count else self._reader.start_time

    @property
    def end_time_ns(self) -> int:
        """One past the last message's log time (rosbags' convention)."""
        stats = self._mcap_stats
        return stats.end_ns + 1 if stats is not None and stats.message_count else self._reader.end_time

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



