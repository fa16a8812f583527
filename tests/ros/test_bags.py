"""Bag I/O (rad2_datasets.bags) and the bag verbs: rad2 data to-bag, graph record, eval latency-report.

Real MCAP files throughout; the record test runs a real rclpy publisher process over DDS.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from rad2_core.geometry import wrap_angle
from rad2_core.storage import save_clip
from rad2_datasets import bags, input_bags
from rad2_ros.latency import records_from_bag, summarise
from synthetic_scenes import make_clip

ROOT = Path(__file__).resolve().parents[2]
RAD2 = ["-m", "rad2_bringup.cli"]  # after the interpreter: rad2 <group> <verb> ...

PY = sys.executable
START_S = 1_700_000_000.0


@pytest.fixture(scope="module")
def clip_bag(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("clipbag")
    clip = make_clip(num_steps=41)
    clip_file = save_clip(clip, tmp / "clip.npz")
    source = input_bags.load_clip_source(None, None, None, str(clip_file))
    counts = input_bags.clip_to_bag(source, tmp / "bag", start_time_s=START_S)
    return source.clip, clip_file, tmp / "bag", counts  # the clip as read back from disk


def test_clip_to_bag_counts_stamps_and_content(clip_bag):
    clip, clip_file, bag, counts = clip_bag
    t = clip.num_steps
    assert counts == {"/viz/ego_log": 1, "/clock": t, "/localization/odometry": t,
                      "/perception/objects": t, "/viz/scene": t}
    with bags.BagReader(bag) as reader:
        topics = reader.topics
        assert topics["/localization/odometry"] == bags.TopicInfo("nav_msgs/msg/Odometry", t)
        assert topics["/perception/objects"].msgtype == "rad2_msgs/msg/PerceptionInputs"
        assert topics["/viz/scene"].msgtype == "visualization_msgs/msg/MarkerArray"
        assert topics["/clock"].msgtype == "rosgraph_msgs/msg/Clock"
        meta = reader.custom_data
        assert meta["map_file"] == str(clip_file.resolve())
        assert meta["clip_id"] == clip.clip_id
        assert float(meta["dt"]) == clip.dt
        msgs = list(reader.messages(["/localization/odometry", "/perception/objects", "/clock"]))
    start_ns = int(START_S * 1e9)
    odom = [m for m in msgs if m.topic == "/localization/odometry"]
    objs = [m for m in msgs if m.topic == "/perception/objects"]
    clocks = [m for m in msgs if m.topic == "/clock"]
    expected = [start_ns + round(k * clip.dt * 1e9) for k in range(t)]
    assert [m.log_time_ns for m in odom] == expected
    assert [bags.time_to_ns(m.msg.header.stamp) for m in objs] == expected
    assert [bags.time_to_ns(m.msg.clock) for m in clocks] == expected
    for k in (0, 17, t - 1):
        o = odom[k].msg
        assert o.header.frame_id == "map" and o.child_frame_id == "base_link"
        assert o.pose.pose.position.x == pytest.approx(clip.ego_x[k])
        assert o.pose.pose.position.y == pytest.approx(clip.ego_y[k])
        q = o.pose.pose.orientation
        assert wrap_angle(2 * np.arctan2(q.z, q.w) - clip.ego_yaw[k]) == pytest.approx(0.0, abs=1e-9)
        assert o.twist.twist.linear.x == pytest.approx(clip.ego_speed[k])
        agents = clip.agents_at(k)
        got = objs[k].msg.agents
        assert [a.id for a in got] == agents.ids.tolist()
        assert len(got) == len(agents) > 0
        np.testing.assert_allclose([a.pose.x for a in got], agents.x, rtol=1e-9)
        np.testing.assert_allclose([a.velocity_y for a in got], agents.vy, atol=1e-5)
        np.testing.assert_allclose([a.length for a in got], agents.length, rtol=1e-6)


def test_mcap_readable_by_mcap_ros2_with_embedded_schemas(clip_bag):
    """What Foxglove does: decode every message from the schemas stored in the MCAP file alone."""
    from mcap.reader import make_reader
    from mcap_ros2.decoder import DecoderFactory

    clip, _, bag, counts = clip_bag
    (mcap_file,) = bag.glob("*.mcap")
    with mcap_file.open("rb") as f:
        reader = make_reader(f, decoder_factories=[DecoderFactory()])
        schemas = {s.name: s for s in reader.get_summary().schemas.values()}
        assert set(schemas) == {"nav_msgs/msg/Odometry", "rad2_msgs/msg/PerceptionInputs",
                                "visualization_msgs/msg/MarkerArray", "rosgraph_msgs/msg/Clock",
                                "nav_msgs/msg/Path"}
        assert all(s.encoding == "ros2msg" for s in schemas.values())
        assert "MSG: rad2_msgs/AgentState" in schemas["rad2_msgs/msg/PerceptionInputs"].data.decode()
        seen: dict[str, int] = {}
        for _, channel, _, decoded in reader.iter_decoded_messages():
            seen[channel.topic] = seen.get(channel.topic, 0) + 1
            if channel.topic == "/perception/objects" and seen[channel.topic] == 5:
                agents = clip.agents_at(4)
                assert [a.id for a in decoded.agents] == agents.ids.tolist()
                assert decoded.agents[0].pose.theta == pytest.approx(agents.yaw[0])
            if channel.topic == "/viz/scene" and seen[channel.topic] == 1:
                ns = {m.ns for m in decoded.markers}
                assert {"lane_centerline", "route", "agents", "ego"} <= ns
                assert all(m.header.frame_id == "map" for m in decoded.markers)
    assert seen == counts


def test_typestore_roundtrip_custom_and_standard_messages(tmp_path):
    store = bags.typestore()
    stage = bags.new_message("rad2_msgs/StageLatency", name="encode", milliseconds=3.0)
    diag = bags.new_message("rad2_msgs/msg/PlanningDiagnostics", node="planner", total_ms=12.5,
                            stages=[stage])
    bev = bags.new_message("rad2_msgs/msg/BevFeatures", height=2, width=3,
                           data=np.arange(6, dtype=np.float32), channel_names=["a"])
    path = bags.new_message("nav_msgs/msg/Path", header=bags.header(42, "base_link"))
    with bags.BagWriter(tmp_path / "b") as w:
        w.write("/d", diag, 10)
        w.write("/bev", bev, 20)
        w.write("/path", bags.serialize(path), 30, msgtype="nav_msgs/Path")
        w.set_metadata("note", "x")
    with bags.BagReader(tmp_path / "b") as r:
        got = {m.topic: m for m in r.messages()}
        assert r.custom_data == {"note": "x"}
    assert got["/d"].msg.stages[0].name == "encode" and got["/d"].msg.total_ms == 12.5
    np.testing.assert_array_equal(got["/bev"].msg.data, np.arange(6))
    assert got["/path"].msgtype == "nav_msgs/msg/Path" and got["/path"].msg.header.frame_id == "base_link"
    assert got["/path"].log_time_ns == 30
    assert "rad2_msgs/msg/SceneTokens" in store.fielddefs
    with pytest.raises(bags.BagError, match="exists already"):
        bags.BagWriter(tmp_path / "b")


def test_bad_bags_give_clear_errors(clip_bag, tmp_path):
    _, _, bag, _ = clip_bag
    with pytest.raises(bags.BagError, match="does not exist"):
        bags.BagReader(tmp_path / "missing")
    (tmp_path / "notabag").mkdir()
    with pytest.raises(bags.BagError, match="no metadata.yaml"):
        bags.BagReader(tmp_path / "notabag")
    with bags.BagReader(bag) as reader, pytest.raises(bags.BagError, match="no topic.*holds"):
        list(reader.messages(["/nope"]))
    # a truncated MCAP file (recording cut off mid-write)
    broken = tmp_path / "broken"
    broken.mkdir()
    (mcap,) = bag.glob("*.mcap")
    (broken / "metadata.yaml").write_text((bag / "metadata.yaml").read_text())
    (broken / mcap.name).write_bytes(mcap.read_bytes()[: mcap.stat().st_size // 2])
    with pytest.raises(bags.BagError, match="corrupt|truncated"):
        with bags.BagReader(broken, repair=False) as reader:
            list(reader.messages())
    # garbage metadata
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "metadata.yaml").write_text("rosbag2_bagfile_information: [1, 2\n")
    with pytest.raises(bags.BagError):
        with bags.BagReader(junk) as reader:
            list(reader.messages())
    # the CLIs: clear message, non-zero exit
    missing_clip = str(tmp_path / "no.npz")
    for cmd in ([*RAD2, "eval", "latency-report", "--bag", str(broken)],
                [*RAD2, "eval", "latency-report", "--bag", str(bag)],  # no diagnostics topic
                [*RAD2, "data", "to-bag", "--clip", missing_clip, "--out", str(tmp_path / "o")]):
        res = subprocess.run([PY, *cmd], capture_output=True, text=True, timeout=60)
        assert res.returncode == 2, res.stderr
        assert "error:" in res.stderr and "Traceback" not in res.stderr
    # the readers repair a truncated bag on open (the latency report's did, above): it opens with what
    # was complete (here nothing: the cut falls inside the one chunk this offline writer wrote), the
    # damaged original is kept beside it
    with bags.BagReader(broken) as reader:
        assert reader.message_count == len(list(reader.messages()))
    assert (broken / (mcap.name + bags.DAMAGED_SUFFIX)).is_file()


def test_cli_help():
    for tool in ("data to-bag", "graph record", "eval replay", "eval latency-report", "data repair-bag"):
        res = subprocess.run([PY, *RAD2, *tool.split(), "--help"], capture_output=True, text=True, timeout=60)
        assert res.returncode == 0 and "usage:" in res.stdout, tool


def _write_diagnostics_bag(path: Path, n: int = 100) -> list[float]:
    e2e = [float(k + 1) for k in range(n)]  # 1..100 ms, shuffled order in the bag
    order = np.random.default_rng(0).permutation(n)
    stage = lambda name, ms: bags.new_message("rad2_msgs/msg/StageLatency", name=name, milliseconds=ms)  # noqa: E731
    with bags.BagWriter(path) as w:
        for i, k in enumerate(order):
            msg = bags.new_message(
                "rad2_msgs/msg/PlanningDiagnostics", header=bags.header(10**9 + i * 10**8, "base_link"),
                node="planner", backend="onnxruntime", total_ms=e2e[k] - 0.5, end_to_end_ms=e2e[k],
                stages=[stage("preprocess", 1.0), stage("encode", 2.0 * (k % 2)),
                        stage("denoise_0", 3.0), stage("denoise_1", 4.0)],
                deadline_missed=bool(k >= 93), cycle_count=i + 1,
                deadline_miss_count=0, fallback_active=False)
            w.write("/planning/diagnostics", msg, 10**9 + i * 10**8)
    return e2e


def test_latency_report_percentiles_from_bag(tmp_path):
    e2e = _write_diagnostics_bag(tmp_path / "diag")
    records = records_from_bag(tmp_path / "diag")
    summary = summarise(records)["planner"]
    row = summary["stages"]["end_to_end"]
    assert row["count"] == 100
    assert row["p50"] == pytest.approx(50.5)
    assert row["p90"] == pytest.approx(90.1)
    assert row["p99"] == pytest.approx(99.01)
    assert row["max"] == 100.0 and row["mean"] == pytest.approx(np.mean(e2e))
    assert summary["stages"]["total"]["max"] == 99.5
    assert summary["stages"]["encode"]["p50"] == pytest.approx(1.0)
    assert summary["stages"]["denoise_all"]["max"] == 7.0
    assert list(summary["stages"])[:4] == ["preprocess", "encode", "denoise_0", "denoise_1"]
    assert summary["deadline_missed"] == 7 and summary["deadline_miss_rate"] == pytest.approx(0.07)
    assert summary["cycles_by_counter"] == 100 and summary["dropped_diagnostics"] == 0
    res = subprocess.run([PY, *RAD2, "eval", "latency-report", "--bag", str(tmp_path / "diag"),
                          "--json", str(tmp_path / "lat.json"), "--png", str(tmp_path / "lat.png")],
                         capture_output=True, text=True, timeout=90)
    assert res.returncode == 0, res.stderr
    assert "end_to_end" in res.stdout and "7/100" in res.stdout
    doc = json.loads((tmp_path / "lat.json").read_text())
    assert doc["nodes"]["planner"]["stages"]["end_to_end"]["p99"] == pytest.approx(99.01)
    assert (tmp_path / "lat.png").stat().st_size > 10_000


# --------------------------------------------------------------------------------------------------
# rad2 graph record against a live rclpy publisher process
# --------------------------------------------------------------------------------------------------

_PUBLISHER = textwrap.dedent("""
    import sys, time
    import rclpy
    from nav_msgs.msg import Odometry
    from rad2_msgs.msg import PlanningDiagnostics, StageLatency
    from rclpy.qos import QoSProfile, ReliabilityPolicy
    rclpy.init()
    node = rclpy.create_node("bag_test_publisher")
    odom_pub = node.create_publisher(
        Odometry, "localization/odometry", QoSProfile(depth=1, reliability=ReliabilityPolicy.BEST_EFFORT))
    diag_pub = node.create_publisher(PlanningDiagnostics, "planning/diagnostics", 10)
    end = time.monotonic() + float(sys.argv[1])
    i = 0
    while time.monotonic() < end:
        o = Odometry()
        o.header.frame_id = "map"
        o.header.stamp.sec = 1000 + i
        o.pose.pose.position.x = float(i)
        odom_pub.publish(o)
        d = PlanningDiagnostics(node="planner", cycle_count=i, total_ms=float(i))
        d.stages = [StageLatency(name="encode", milliseconds=1.5)]
        diag_pub.publish(d)
        i += 1
        rclpy.spin_once(node, timeout_sec=0.05)
    print("published", i, flush=True)
    node.destroy_node()
    rclpy.shutdown()
""")


def _ros_env(domain_id: int) -> dict[str, str]:
    from rad2_ros.rosenv import ros_environment

    return ros_environment(domain_id, require_build=True)


requires_build = pytest.mark.skipif(
    not (ROOT / "ros2_ws" / "install" / "rad2_msgs").is_dir(),
    reason="ros2_ws is not built (run tools/bootstrap.sh): rad2_msgs Python types are needed")


@requires_build
def test_record_bag_records_live_publisher(tmp_path):
    domain = 150 + os.getpid() % 50
    env = _ros_env(domain)
    script = tmp_path / "pub.py"
    script.write_text(_PUBLISHER)
    venv_py = str(Path(env["RAD2_VENV"]) / "bin" / "python")
    pub = subprocess.Popen([venv_py, str(script), "12"], env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    try:
        t0 = time.monotonic()
        res = subprocess.run([venv_py, *RAD2, "graph", "record", "--out", str(tmp_path / "rec"),
                              "--topics", "/localization/odometry", "planning/diagnostics",
                              "--duration", "3", "--wait-topics", "20"],
                             env=env, capture_output=True, text=True, timeout=60)
        assert res.returncode == 0, res.stderr
        assert time.monotonic() - t0 < 45
        # unknown topic: clear error, non-zero exit, no empty bag left behind
        bad = subprocess.run([venv_py, *RAD2, "graph", "record", "--out", str(tmp_path / "bad"),
                              "--topics", "/no/such/topic", "--duration", "1", "--wait-topics", "1"],
                             env=env, capture_output=True, text=True, timeout=60)
        assert bad.returncode == 2 and "/no/such/topic" in bad.stderr and "Traceback" not in bad.stderr
        assert not (tmp_path / "bad").exists()
    finally:
        pub.wait(timeout=30)
    with bags.BagReader(tmp_path / "rec") as reader:
        topics = reader.topics
        assert set(topics) == {"/localization/odometry", "/planning/diagnostics"}
        assert topics["/localization/odometry"].msgtype == "nav_msgs/msg/Odometry"
        assert topics["/planning/diagnostics"].msgtype == "rad2_msgs/msg/PlanningDiagnostics"
        msgs = list(reader.messages())
    odom = [m for m in msgs if m.topic == "/localization/odometry"]
    diag = [m for m in msgs if m.topic == "/planning/diagnostics"]
    # ~20 Hz for 3 s; allow for a slow, shared machine
    assert len(odom) >= 20 and len(diag) >= 20
    xs = [m.msg.pose.pose.position.x for m in odom]
    assert xs == sorted(xs) and all(m.msg.header.frame_id == "map" for m in odom)
    assert all(m.msg.header.stamp.sec == 1000 + int(m.msg.pose.pose.position.x) for m in odom)
    assert diag[-1].msg.stages[0].name == "encode" and diag[-1].msg.node == "planner"
    assert diag[-1].msg.cycle_count - diag[0].msg.cycle_count == len(diag) - 1  # reliable: none lost
    span = (msgs[-1].log_time_ns - msgs[0].log_time_ns) * 1e-9
    assert 2.0 < span < 4.0  # wall-clock log times over the --duration window


@requires_build
def test_sigkilled_recorder_leaves_a_bag_that_opens(tmp_path):
    """rad2 graph record, killed with SIGKILL while recording a live publisher: the bag opens as it is in
    the project's reader and in the mcap package's, and what is missing is at most 1 s of log time."""
    domain = 100 + os.getpid() % 50
    env = _ros_env(domain)
    script = tmp_path / "pub.py"
    script.write_text(_PUBLISHER)
    venv_py = str(Path(env["RAD2_VENV"]) / "bin" / "python")
    pub = subprocess.Popen([venv_py, str(script), "30"], env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    rec = subprocess.Popen([venv_py, *RAD2, "graph", "record", "--out", str(tmp_path / "rec"), "--topics",
                            "/localization/odometry", "planning/diagnostics", "--wait-topics", "20"],
                           env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # recording once the bag holds messages (metadata.yaml is rewritten with every chunk)
        end = time.monotonic() + 40
        while time.monotonic() < end and rec.poll() is None:
            meta = tmp_path / "rec" / "metadata.yaml"
            if meta.is_file() and "message_count: 0" not in meta.read_text():
                break
            time.sleep(0.1)
        time.sleep(2.0)
        kill_ns = time.time_ns()
        rec.send_signal(signal.SIGKILL)
        rec.wait(timeout=10)
    finally:
        for proc in (rec, pub):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert rec.returncode == -signal.SIGKILL, rec.stderr.read()[-2000:]
    with bags.BagReader(tmp_path / "rec", repair=False) as reader:
        msgs = list(reader.messages())
        assert reader.message_count == len(msgs) and set(reader.topics) == {
            "/localization/odometry", "/planning/diagnostics"}
    (mcap,) = (tmp_path / "rec").glob("*.mcap")
    assert len(_mcap_package_reads(mcap)) == len(msgs)
    lost_s = (kill_ns - max(m.log_time_ns for m in msgs)) * 1e-9
    print(f"rad2 graph record SIGKILLed: the bag opens as it is with {len(msgs)} messages; the last one "
          f"logged {lost_s:.3f} s before the kill")
    assert len(msgs) > 20 and lost_s <= 1.0, lost_s


# --------------------------------------------------------------------------------------------------
# Crash-safe recording: bounded loss and recovery of bags whose writer died
# --------------------------------------------------------------------------------------------------


def _odom(i: int) -> object:
    msg = bags.new_message("nav_msgs/msg/Odometry", header=bags.header(i, "map"))
    msg.pose.pose.position.x = float(i)
    return msg


def _raw_messages(bag: Path) -> list[tuple[str, int, bytes]]:
    with bags.BagReader(bag) as reader:
        return [(m.topic, m.log_time_ns, bytes(m.msg)) for m in reader.messages(raw=True)]


def _snapshot_as_killed(bag: Path, dest: Path, metadata: bool = True) -> None:
    """What a SIGKILL leaves: the files on disk now (the MCAP, and metadata.yaml unless ``metadata`` is
    False: the bag of a writer that writes metadata.yaml only at close)."""
    dest.mkdir()
    for f in [*bag.glob("*.mcap"), *(bag.glob("metadata.yaml") if metadata else [])]:
        shutil.copyfile(f, dest / f.name)


def _mcap_package_reads(mcap_file: Path) -> list[tuple[str, int, bytes]]:
    """The messages as Foxglove's ``mcap`` package reads them (its seeking reader: summary and chunk
    indexes), decoded with ``mcap_ros2`` to check the schemas are usable."""
    from mcap.reader import make_reader
    from mcap_ros2.decoder import DecoderFactory

    with mcap_file.open("rb") as f:
        reader = make_reader(f, decoder_factories=[DecoderFactory()])
        out = [(channel.topic, message.log_time, bytes(message.data))
               for _, channel, message, _ in reader.iter_decoded_messages()]
        assert reader.get_summary().statistics.message_count == len(out)
    return out


def test_a_killed_writers_bag_opens_as_it_is_and_old_bags_are_repaired_on_open(tmp_path, monkeypatch):
    """The project's writer with timed chunks; the bag is cut the way a killed writer leaves it (the
    pending chunk never written): it opens without repair in the project's reader and in the mcap
    package's. A bag without metadata.yaml or cut mid-chunk (another writer, or a kill inside the
    write of a chunk) is repaired on open, or refused with the repair command when asked not to."""
    clock = [0.0]  # the writer's chunk clock, driven here: message i is written at i * 0.1 s
    monkeypatch.setattr(bags.writer, "_monotonic", lambda: clock[0])
    bag = tmp_path / "live"
    written: list[tuple[str, int, bytes]] = []
    writer = bags.BagWriter(bag, chunk_duration_s=0.95)
    writer.open()
    writer.set_metadata("recorded_by", "test")
    for i in range(57):
        clock[0] = i * 0.1
        topic = "/odom" if i % 3 else "/diag"
        msg = _odom(i) if topic == "/odom" else bags.new_message(
            "rad2_msgs/msg/PlanningDiagnostics", node="planner", cycle_count=i)
        writer.write(topic, msg, 10**9 + i * 10**7)
        written.append((topic, 10**9 + i * 10**7, bags.serialize(msg)))
    # a chunk is synced with the first write 0.95 s after the newest message on disk: 0-10, 11-20, ..
    chunk_ends = [11, 21, 31, 41, 51]
    assert writer.synced_chunks == 5
    clock[0] = 5.9
    assert not writer.flush_if_due()  # 51-56 stay in memory until 0.95 s after message 50
    _snapshot_as_killed(bag, tmp_path / "killed")
    _snapshot_as_killed(bag, tmp_path / "old_writer", metadata=False)
    _snapshot_as_killed(bag, tmp_path / "killed_again", metadata=False)
    metadata_after_5_chunks = (bag / "metadata.yaml").read_text()
    clock[0] = 6.0
    assert writer.flush_if_due() and writer.synced_chunks == 6  # idle: synced without a new write
    writer.close()
    assert _raw_messages(bag) == written  # the finished bag holds everything

    # killed between a chunk reaching the MCAP and metadata.yaml being replaced: metadata.yaml is one
    # chunk behind the file; counts and time range follow the file, which is what the reader yields
    between = tmp_path / "between"
    _snapshot_as_killed(bag, between, metadata=False)
    (between / "metadata.yaml").write_text(metadata_after_5_chunks)
    with bags.BagReader(between, repair=False) as reader:
        msgs = list(reader.messages(raw=True))
        assert len(msgs) == reader.message_count == len(written) == 57
        assert sum(i.count for i in reader.topics.values()) == 57
        assert (reader.start_time_ns, reader.end_time_ns - 1) == (10**9, 10**9 + 56 * 10**7)
    assert bags.recover_bag(between).repaired  # the stale metadata.yaml is rewritten on request
    with bags.BagReader(between, repair=False) as reader:
        assert reader.message_count == 57

    # as a SIGKILL left it: complete up to the last chunk written, no repair needed, in either reader
    killed = tmp_path / "killed"
    with bags.BagReader(killed, repair=False) as reader:
        assert reader.message_count == 51 and reader.custom_data == {"recorded_by": "test"}
    assert _raw_messages(killed) == written[: chunk_ends[-1]]
    assert _mcap_package_reads(killed / "live.mcap") == written[: chunk_ends[-1]]
    assert not bags.recover_bag(killed).repaired

    # a writer that left no metadata.yaml (an older one): refused with the repair command, or repaired
    old_writer = tmp_path / "old_writer"
    with pytest.raises(bags.BagError, match="no metadata.yaml.*rad2 data repair-bag"):
        bags.BagReader(old_writer, repair=False)
    with bags.BagReader(old_writer) as reader:
        assert reader.repaired is not None and reader.repaired.repaired and reader.message_count == 51
    killed = tmp_path / "killed_again"
    report = bags.recover_bag(killed)
    assert report.repaired and report.had_footer
    assert report.messages == {"/odom": 34, "/diag": 17}
    assert (report.start_ns, report.end_ns) == (10**9, 10**9 + 50 * 10**7)
    assert [p.name for p in report.damaged_files] == ["live.mcap.damaged"]
    assert (killed / "live.mcap.damaged").is_file()
    assert _raw_messages(killed) == written[: chunk_ends[-1]]
    with bags.BagReader(killed) as reader:  # metadata.yaml consistent with the new MCAP
        assert reader.message_count == 51
        assert reader.topics["/diag"] == bags.TopicInfo("rad2_msgs/msg/PlanningDiagnostics", 17)
        assert (reader.start_time_ns, reader.end_time_ns - 1) == (report.start_ns, report.end_ns)
    from mcap.reader import make_reader  # the new file has a summary and chunk index again
    with (killed / "killed_again.mcap").open("rb") as f:
        summary = make_reader(f).get_summary()
        assert summary.statistics.message_count == 51 and summary.chunk_indexes
    again = bags.recover_bag(killed)  # a complete bag is left alone
    assert not again.repaired and again.message_count == 51
    # complete MCAP beside a stale metadata.yaml (from before the recovery): rewritten to agree
    stale = (killed / "metadata.yaml").read_text().replace("message_count: 51", "message_count: 7")
    (killed / "metadata.yaml").write_text(stale)
    fixed = bags.recover_bag(killed)
    assert fixed.repaired and fixed.message_count == 51 and fixed.had_footer and fixed.lost_tail_s == 0.0
    assert (killed / "metadata.yaml.damaged").read_text() == stale
    assert _raw_messages(killed) == written[: chunk_ends[-1]]
    assert "killed_again.mcap.damaged" in {p.name for p in killed.iterdir()}

    # cut in the middle of the third chunk, metadata.yaml stale (from the finished bag)
    with (bag / "live.mcap").open("rb") as f:
        chunks = make_reader(f).get_summary().chunk_indexes
    cut = chunks[2].chunk_start_offset + chunks[2].chunk_length // 2
    truncated = tmp_path / "truncated"
    truncated.mkdir()
    (truncated / "live.mcap").write_bytes((bag / "live.mcap").read_bytes()[:cut])
    shutil.copyfile(bag / "metadata.yaml", truncated / "metadata.yaml")
    with pytest.raises(bags.BagError, match="truncated.*rad2 data repair-bag"):
        with bags.BagReader(truncated, repair=False) as reader:
            list(reader.messages())
    report = bags.recover_bag(truncated)
    assert _raw_messages(truncated) == written[: chunk_ends[1]]
    assert report.end_ns == 10**9 + 20 * 10**7
    assert report.lost_until_ns == 10**9 + 56 * 10**7  # from the stale metadata.yaml
    assert report.lost_tail_s == pytest.approx(0.36)
    assert sorted(p.name for p in report.damaged_files) == ["live.mcap.damaged", "metadata.yaml.damaged"]
    with bags.BagReader(truncated) as reader:
        assert reader.custom_data == {"recorded_by": "test"}  # carried over from the stale metadata


def test_repair_bag_cli(tmp_path):
    with bags.BagWriter(tmp_path / "b", chunk_duration_s=0.01) as w:
        for i in range(5):
            w.write("/odom", _odom(i), 10**9 + i * 10**8)
            time.sleep(0.02)
        _snapshot_as_killed(tmp_path / "b", tmp_path / "k", metadata=False)  # an older writer's bag
    res = subprocess.run([PY, *RAD2, "data", "repair-bag", str(tmp_path / "k")],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert "/odom: 5 messages" in res.stdout and "repaired" in res.stdout
    (tmp_path / "notabag").mkdir()
    for bad in (tmp_path / "notabag", tmp_path / "missing", Path(__file__)):
        res = subprocess.run([PY, *RAD2, "data", "repair-bag", str(bad)],
                             capture_output=True, text=True, timeout=60)
        assert res.returncode == 2 and "rad2 data repair-bag: error:" in res.stderr and str(bad) in res.stderr
        assert "Traceback" not in res.stderr


_KILLED_WRITER = textwrap.dedent("""
    import sys, time
    from rad2_datasets import bags
    from rad2_ros.nodes.recording import chunk_duration_s, open_writer
    period = float(sys.argv[2])
    writer = open_writer(sys.argv[1])  # chunk duration from params/nodes.yaml, like rad2 graph record
    writer.open()
    print("chunk", chunk_duration_s(), flush=True)
    i = 0
    next_t = time.monotonic()
    while True:
        stamp = time.time_ns()
        msg = bags.new_message("nav_msgs/msg/Odometry", header=bags.header(stamp, "map"))
        msg.pose.pose.position.x = float(i)
        writer.write("/odom", msg, stamp)
        # one write per line: with PYTHONUNBUFFERED, print() issues a syscall per argument and the kill
        # could split a line
        sys.stdout.write(f"wrote {i} {stamp}\\n")
        sys.stdout.flush()  # what was handed to the writer before the kill
        i += 1
        next_t += period
        while time.monotonic() < next_t:
            writer.flush_if_due()
            time.sleep(min(0.005, max(0.0, next_t - time.monotonic())))
""")


def test_sigkilled_writer_loses_at_most_one_chunk(tmp_path):
    """A real process writing at 50 Hz is SIGKILLed after ~3 s; the bag opens as it is (no repair, in
    the project's reader and the mcap package's) and the lost tail stays within chunk_duration_s + one
    publish period, under 1 s. metadata.yaml is at most one checkpoint behind the MCAP."""
    period = 0.02
    script = tmp_path / "writer.py"
    script.write_text(_KILLED_WRITER)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [*(str(p.parent) for p in sorted((ROOT / "ros2_ws" / "src").glob("*/setup.py"))),
         os.environ.get("PYTHONPATH", "")]))
    child = subprocess.Popen([PY, str(script), str(tmp_path / "rec"), str(period)], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = child.stdout.readline()
        assert first.startswith("chunk"), child.stderr.read()
        chunk_s = float(first.split()[1])
        time.sleep(3.0)
        kill_ns = time.time_ns()
        child.send_signal(signal.SIGKILL)
        out, _ = child.communicate(timeout=10)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == -signal.SIGKILL
    # a line the kill cut short (no newline yet) names nothing that was surely handed over
    complete = out.splitlines()[:-1] if not out.endswith("\n") else out.splitlines()
    sent = [(int(i), int(stamp)) for _, i, stamp in (line.split() for line in complete)]
    assert len(sent) > 50
    with bags.BagReader(tmp_path / "rec", repair=False) as reader:
        got = [(int(m.msg.pose.pose.position.x), m.log_time_ns) for m in reader.messages()]
        assert reader.message_count == len(got)
    assert len(_mcap_package_reads(tmp_path / "rec" / "rec.mcap")) == len(got)
    # nothing to repair, except where the kill fell between the MCAP's fsync and metadata.yaml's
    # replacement (two files cannot change in one step): then metadata.yaml is one checkpoint behind
    # the MCAP, and the repair rewrites it losing no message
    report = bags.recover_bag(tmp_path / "rec")
    if report.repaired:
        assert report.message_count == len(got) and report.skipped_messages == 0, report.summary()
    # an exact prefix of what was written; the writer logs a message after writing it, so the kill can
    # fall between the two and the bag may hold one message more than the log names (index len(sent))
    assert got[: len(sent)] == sent[: len(got)]
    assert len(got) <= len(sent) + 1 and all(i == k for k, (i, _) in enumerate(got))
    lost_s = max(0.0, (sent[-1][1] - got[-1][1]) * 1e-9)  # written before the kill but not on disk
    print(f"SIGKILL after {len(sent)} messages: {len(got)} in the bag as it was left, lost tail "
          f"{lost_s:.3f} s (kill - last in the bag: {(kill_ns - got[-1][1]) * 1e-9:.3f} s)")
    assert lost_s <= chunk_s + period and lost_s <= 1.0


def test_latency_summary_of_the_fused_sampler_keeps_denoise_total_in_pipeline_order():
    """The fused sampler reports one denoise_total (no per-step keys): it is listed after encode and
    not summed again into denoise_all."""
    recs = [{"node": "planner", "backend": "onnxruntime", "total_ms": 20.0 + i, "end_to_end_ms": 25.0 + i,
             "deadline_missed": False, "cycle_count": i + 1, "deadline_miss_count": 0,
             "rejected_input_count": 0, "fallback_active": False, "fallback_reason": "",
             "stages": {"publish": 1.0, "select": 0.5, "denoise_total": 10.0 + i, "preprocess": 1.0,
                        "encode": 2.0}} for i in range(5)]
    stages = summarise(recs)["planner"]["stages"]
    assert list(stages)[:4] == ["preprocess", "encode", "denoise_total", "select"]
    assert "denoise_all" not in stages and stages["denoise_total"]["max"] == 14.0
