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

Modules: ``messages`` (typestore, types, CDR), ``writer``, ``reader``, ``recovery``; their names are
re-exported here, so ``from rad2_datasets import bags`` then ``bags.BagWriter`` works.
"""

from rad2_datasets.bags.messages import (  # noqa: F401
    _MCAP_MAGIC,
    _PRIMITIVE_DTYPES,
    DAMAGED_SUFFIX,
    META_PREFIX,
    RAD2_MSGS_PACKAGE,
    REPAIR_COMMAND,
    ROSBAG2_VERSION,
    TYPESTORE_DISTRO,
    BagError,
    _default_value,
    _name_in,
    _share_dirs,
    _types_from_msg_dir,
    deserialize,
    ensure_type,
    header,
    new_message,
    normalize_msgtype,
    ns_to_time,
    planning_diagnostics_record,
    rad2_msgs_dir,
    serialize,
    time_to_ns,
    typestore,
)
from rad2_datasets.bags.reader import (  # noqa: F401
    BagMessage,
    BagReader,
    TopicInfo,
    _repair_hint,
    _unfinished,
    mcap_is_complete,
    resolve_bag_path,
)
from rad2_datasets.bags.recovery import (  # noqa: F401
    _OP_CHUNK,
    _OP_FOOTER,
    RecoveryReport,
    _PrefixReader,
    _scan_mcap_records,
    _stale_metadata,
    _unique_beside,
    recover_bag,
)
from rad2_datasets.bags.writer import (  # noqa: F401
    BagWriter,
    _DurableMcapStorage,
    _OffsetBuffer,
    _OpenedInWith,
    _remove_bag_dir,
)
