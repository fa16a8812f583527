"""Log readers: Waymo Open Motion Dataset TFRecords (no TensorFlow), Argoverse 2 sensor logs, and lane
adjacency of Argoverse 2 map archives. The WOMD file and the AV2 sensor log are written by the tests."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from rad2_core.clip import AGENT_PEDESTRIAN, AGENT_VEHICLE
from rad2_core.config import load_merged, load_params
from rad2_core.lane_map import NO_LANE, SIGNAL_GREEN, SIGNAL_RED
from rad2_core.storage import load_dataset

LOG_PARAMS = load_merged("bev", "sim", "validators")

FIXTURES = Path(__file__).parents[1] / "fixtures"
AV2_DIR = FIXTURES / "av2" / "0a1e6f0a-1817-4a98-b02e-db8c9327d151"
ROOT = Path(__file__).resolve().parents[2]
SIM_DT = float(load_params("sim")["sim"]["dt"])

# the synthetic WOMD scene: lanes 100 (y = 0) and 101 (y = 3.7, left of 100) run along +x for 200 m; lane 102
# continues 100 to x = 300 behind a signal at x = 200 that turns from STOP to GO at step 50
LANE_W = 3.7
STEPS = 91
GO_STEP = 50


def _points(msg_list, xy):
    for x, y in xy:
        p = msg_list.add()
        p.x, p.y, p.z = float(x), float(y), 0.0


def _straight(x0, x1, y, step=2.0):
    xs = np.arange(x0, x1 + 1e-9, step)
    return np.stack([xs, np.full_like(xs, y)], axis=1)


def make_scenario(times=None, scenario_id="synthetic-0001"):
    from rad2_datasets.adapters.womd_protos.waymo_open_dataset.protos import scenario_pb2

    times = np.arange(STEPS) * 0.1 if times is None else np.asarray(times)
    sc = scenario_pb2.Scenario(scenario_id=scenario_id, current_time_index=10, sdc_track_index=1)
    sc.timestamps_seconds.extend(times.tolist())

    def lane(fid, xy, mph, lane_type, exits=()):
        f = sc.map_features.add(id=fid)
        f.lane.speed_limit_mph = mph
        f.lane.type = lane_type
        _points(f.lane.polyline, xy)
        f.lane.exit_lanes.extend(exits)
        return f.lane

    l100 = lane(100, _straight(0, 200, 0.0), 25.0, 2, exits=[102])
    l101 = lane(101, _straight(0, 200, LANE_W), 0.0, 2)
    lane(102, _straight(200, 300, 0.0), 0.0, 1)
    n = l100.left_neighbors.add(
        feature_id=101, self_start_index=0, self_end_index=100, neighbor_start_index=0, neighbor_end_index=100
    )
    n.boundaries.add(
        lane_start_index=0, lane_end_index=100, boundary_feature_id=200, boundary_type=1
    )  # broken
    n = l101.right_neighbors.add(
        feature_id=100, self_start_index=0, self_end_index=100, neighbor_start_index=0, neighbor_end_index=100
    )
    n.boundaries.add(
        lane_start_index=0, lane_end_index=100, boundary_feature_id=200, boundary_type=2
    )  # solid
    l100.left_boundaries.add(lane_start_index=0, lane_end_index=100, boundary_feature_id=200, boundary_type=1)
    l100.right_boundaries.add(lane_start_index=0, lane_end_index=100, boundary_feature_id=201)
    f = sc.map_features.add(id=200)
    f.road_line.type = 1
    _points(f.road_line.polyline, _straight(-5, 205, LANE_W / 2, step=5.0))
    f = sc.map_features.add(id=201)
    f.road_edge.type = 1
    _points(f.road_edge.polyline, _straight(-5, 305, -LANE_W / 2 - 0.2, step=5.0))
    f = sc.map_features.add(id=300)
    _points(f.crosswalk.polygon, [(204, -2), (208, -2), (208, 6), (204, 6)])
    f = sc.map_features.add(id=301)
    f.stop_sign.lane.append(101)  # LaneMap has no stop signs: only counted in the metadata

    t = np.arange(STEPS) * 0.1

    def track(tid, otype, x, y, vx, length, width, valid):
        tr = sc.tracks.add(id=tid, object_type=otype)
        for k in range(STEPS):
            s = tr.states.add(valid=bool(valid[k]))
            if valid[k]:
                s.center_x, s.center_y, s.heading = float(x[k]), float(y[k]), 0.0
                s.velocity_x, s.velocity_y = float(vx[k]), 0.0
                s.length, s.width, s.height = length, width, 1.5
        return tr

    all_valid = np.ones(STEPS, bool)
    track(11, 1, 30 + 8 * t, np.full(STEPS, LANE_W), np.full(STEPS, 8.0), 4.5, 1.9, all_valid)
    track(7, 1, 10 + 10 * t, np.zeros(STEPS), np.full(STEPS, 10.0), 4.8, 2.1, all_valid)  # the SDC
    ped_valid = (np.arange(STEPS) >= 20) & (np.arange(STEPS) <= 60)
    track(12, 2, np.full(STEPS, 206.0), 1.0 * t, np.zeros(STEPS), 0.5, 0.5, ped_valid)
    track(13, 4, np.zeros(STEPS), np.zeros(STEPS), np.zeros(STEPS), 1.0, 1.0, np.zeros(STEPS, bool))
    for k in range(STEPS):
        st = sc.dynamic_map_states.add().lane_states.add(lane=102, state=4 if k < GO_STEP else 6)
        st.stop_point.x, st.stop_point.y = 200.0, 0.0
    return sc


@pytest.fixture(scope="module")
def womd_file(tmp_path_factory):
    from rad2_datasets.adapters.womd import write_tfrecord

    path = tmp_path_factory.mktemp("womd") / "synthetic.tfrecord-00000-of-00001"
    second = make_scenario(scenario_id="synthetic-0002")
    return write_tfrecord(path, [make_scenario().SerializeToString(), second.SerializeToString()])


@pytest.fixture(scope="module")
def womd_clip(womd_file):
    from rad2_datasets.adapters.womd import load_womd_scenario

    return load_womd_scenario(womd_file, 0, params=LOG_PARAMS)


# ---------------------------------------------------------------------------------------------------------
# TFRecord / CRC32C / protobuf wire format
# ---------------------------------------------------------------------------------------------------------
WOMD_PROTOS = ROOT / "ros2_ws/src/rad2_datasets/rad2_datasets/adapters/womd_protos"


def test_masked_crc32c_is_tfrecords():
    from rad2_datasets.adapters import womd

    def masked(crc):  # TFRecord stores a CRC rotated right by 15 bits plus 0xA282EAD8
        return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF

    # CRC-32C (Castagnoli) check value, not zlib's CRC-32 (0xCBF43926); RFC 3720 B.4: 32 bytes of zeros
    assert womd.masked_crc32c(b"123456789") == masked(0xE3069283)
    assert womd.masked_crc32c(bytes(32)) == masked(0x8A9136AA)


def test_generated_modules_match_the_committed_protos():
    """Every field (name, number) and enum value declared in the .proto files is in the generated
    modules' descriptors, and nothing else: the committed *_pb2.py files are the committed protos."""
    import re

    from rad2_datasets.adapters.womd_protos import POOL
    from rad2_datasets.adapters.womd_protos.waymo_open_dataset.protos import scenario_pb2

    def walk(msgs, out):
        for m in msgs:
            out |= {("field", f.name, f.number) for f in m.fields}
            out |= {("enum", v.name, v.number) for e in m.enum_types for v in e.values}
            walk(m.nested_types, out)

    protos = sorted((WOMD_PROTOS / "waymo_open_dataset").rglob("*.proto"))
    assert len(protos) == 8
    # "[label] Type name = N" declares a field (oneof members have no label); "NAME = N;" an enum value
    field = re.compile(r"^\s*(?:(?:optional|repeated|required)\s+)?[\w.]+\s+(\w+)\s*=\s*(\d+)\s*[;\[]", re.M)
    value = re.compile(r"^\s*([A-Z][A-Z0-9_]*)\s*=\s*(\d+)\s*;", re.M)
    for path in protos:
        text = re.sub(r"//[^\n]*", "", path.read_text(encoding="utf-8"))
        declared = {("field", n, int(k)) for n, k in field.findall(text)}
        declared |= {("enum", n, int(k)) for n, k in value.findall(text)}
        fd = POOL.FindFileByName(path.relative_to(WOMD_PROTOS).as_posix())
        generated: set = set()
        walk(fd.message_types_by_name.values(), generated)
        generated |= {("enum", v.name, v.number) for e in fd.enum_types_by_name.values() for v in e.values}
        assert declared == generated, path.name
    assert scenario_pb2.Scenario.DESCRIPTOR.file.pool is POOL


def test_the_messages_load_next_to_another_scenario_proto():
    """Another waymo_open_dataset/protos/scenario.proto already in protobuf's default pool (the official
    package, of another version) does not stop the adapter's classes from loading and parsing."""
    code = """
from google.protobuf import descriptor_pb2, descriptor_pool
other = descriptor_pb2.FileDescriptorProto(
    name="waymo_open_dataset/protos/scenario.proto", package="waymo.open_dataset", syntax="proto2")
other.message_type.add(name="Scenario").field.add(name="scenario_id", number=5, type=9, label=1)
descriptor_pool.Default().Add(other)
from rad2_datasets.adapters.womd import parse_scenario
from rad2_datasets.adapters.womd_protos.waymo_open_dataset.protos import scenario_pb2
raw = scenario_pb2.Scenario(scenario_id="s", sdc_track_index=3).SerializeToString()
print(parse_scenario(raw, "x").sdc_track_index)
"""
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and res.stdout.strip() == "3", res.stderr


def _varint(v: int) -> bytes:
    out = bytearray()
    while True:
        b, v = v & 0x7F, v >> 7
        out.append(b | (0x80 if v else 0))
        if not v:
            return bytes(out)


def _tag(field: int, wire: int) -> bytes:
    return _varint(field << 3 | wire)


def _len(field: int, payload: bytes) -> bytes:
    return _tag(field, 2) + _varint(len(payload)) + payload


def _f64(field: int, v: float) -> bytes:
    return _tag(field, 1) + struct.pack("<d", v)


def _f32(field: int, v: float) -> bytes:
    return _tag(field, 5) + struct.pack("<f", v)


def _int(field: int, v: int) -> bytes:
    return _tag(field, 0) + _varint(v)


def test_field_numbers_follow_the_public_protos():
    """Bytes encoded by hand from the field numbers of Waymo's scenario.proto / map.proto decode to the
    right fields of the generated classes: a wrong or stale .proto file would misplace or drop them."""
    from rad2_datasets.adapters.womd import parse_scenario

    state = (
        _f64(2, 1.5)
        + _f64(3, -2.5)
        + _f64(4, 0.1)
        + _f32(5, 4.0)
        + _f32(6, 2.0)
        + _f32(7, 1.6)
        + _f32(8, 0.25)
        + _f32(9, 3.0)
        + _f32(10, -1.0)
        + _int(11, 1)
    )
    track = _int(1, 42) + _int(2, 3) + _len(3, state)
    point = _f64(1, 10.0) + _f64(2, 20.0) + _f64(3, 0.5)
    boundary = _int(1, 0) + _int(2, 3) + _int(3, 77) + _int(4, 4)
    neighbor = _int(1, 9) + _int(2, 0) + _int(3, 5) + _int(4, 1) + _int(5, 6) + _len(6, boundary)
    lane = (
        _f64(1, 35.0)
        + _int(2, 1)
        + _int(3, 1)
        + _len(8, point)
        + _len(9, _varint(5))
        + _len(10, _varint(6) + _varint(7))
        + _len(11, neighbor)
        + _len(12, neighbor)
        + _len(13, boundary)
        + _len(14, boundary)
    )
    signal = _int(1, 8) + _int(2, 6) + _len(3, point)
    raw = (
        _f64(1, 0.0)
        + _f64(1, 0.1)
        + _len(2, track)
        + _int(4, 42)
        + _len(5, b"abc")
        + _int(6, 0)
        + _len(7, _len(1, signal))
        + _len(8, _int(1, 8) + _len(3, lane))
        + _len(8, _int(1, 77) + _len(4, _int(1, 4) + _len(2, point)))
        + _len(8, _int(1, 78) + _len(5, _int(1, 2) + _len(2, point)))
        + _len(8, _int(1, 79) + _len(7, _len(1, _varint(8)) + _len(2, point)))
        + _len(8, _int(1, 80) + _len(8, _len(1, point)))
        + _len(8, _int(1, 81) + _len(9, _len(1, point)))
        + _len(8, _int(1, 82) + _len(10, _len(1, point)))
        + _int(10, 1)
        + _len(11, _int(1, 0) + _int(2, 2))
    )
    sc = parse_scenario(raw, "hand-encoded")
    assert sc.scenario_id == "abc" and list(sc.timestamps_seconds) == [0.0, 0.1]
    assert sc.current_time_index == 1 and sc.sdc_track_index == 0 and list(sc.objects_of_interest) == [42]
    assert sc.tracks_to_predict[0].track_index == 0 and sc.tracks_to_predict[0].difficulty == 2
    tr = sc.tracks[0]
    assert tr.id == 42 and tr.object_type == 3
    s = tr.states[0]
    assert (s.center_x, s.center_y, s.center_z) == (1.5, -2.5, 0.1)
    assert (s.length, s.width, s.height, s.heading) == pytest.approx((4.0, 2.0, 1.6, 0.25))
    assert (s.velocity_x, s.velocity_y, s.valid) == (3.0, -1.0, True)
    ls = sc.dynamic_map_states[0].lane_states[0]
    assert (ls.lane, ls.state, ls.stop_point.x, ls.stop_point.y, ls.stop_point.z) == (8, 6, 10.0, 20.0, 0.5)
    f = sc.map_features
    assert f[0].id == 8 and f[0].WhichOneof("feature_data") == "lane"
    ln = f[0].lane
    assert (ln.speed_limit_mph, ln.type, ln.interpolating) == (35.0, 1, True)
    assert list(ln.entry_lanes) == [5] and list(ln.exit_lanes) == [6, 7] and ln.polyline[0].y == 20.0
    for nb in (ln.left_neighbors[0], ln.right_neighbors[0]):
        assert (
            nb.feature_id,
            nb.self_start_index,
            nb.self_end_index,
            nb.neighbor_start_index,
            nb.neighbor_end_index,
        ) == (9, 0, 5, 1, 6)
        b = nb.boundaries[0]
        assert (b.lane_start_index, b.lane_end_index, b.boundary_feature_id, b.boundary_type) == (0, 3, 77, 4)
    assert ln.left_boundaries[0].boundary_feature_id == 77 and ln.right_boundaries[0].boundary_type == 4
    assert f[1].road_line.type == 4 and f[1].road_line.polyline[0].x == 10.0
    assert f[2].road_edge.type == 2 and len(f[2].road_edge.polyline) == 1
    assert list(f[3].stop_sign.lane) == [8] and f[3].stop_sign.position.x == 10.0
    kinds = [x.WhichOneof("feature_data") for x in f[4:]]
    assert kinds == ["crosswalk", "speed_bump", "driveway"]
    assert f[4].crosswalk.polygon[0].x == 10.0 and f[6].driveway.polygon[0].y == 20.0


def test_tfrecord_framing_round_trip_and_gzip(tmp_path):
    import gzip

    from rad2_datasets.adapters.womd import count_tfrecords, iter_tfrecord, write_tfrecord

    payloads = [b"", b"x", os.urandom(10_000)]
    path = write_tfrecord(tmp_path / "a.tfrecord", payloads)
    assert [d for _, d in iter_tfrecord(path)] == payloads and count_tfrecords(path) == 3
    gz = tmp_path / "a.tfrecord.gz"
    gz.write_bytes(gzip.compress(path.read_bytes()))
    assert [d for _, d in iter_tfrecord(gz)] == payloads


# ---------------------------------------------------------------------------------------------------------
# WOMD scenario -> clip
# ---------------------------------------------------------------------------------------------------------
def test_womd_tracks(womd_clip):
    c = womd_clip.validate()
    assert c.metadata["source"] == "womd" and c.metadata["scenario_id"] == "synthetic-0001"
    assert c.clip_id == "womd_synthetic-0001" and c.dt == pytest.approx(SIM_DT)
    assert c.num_steps == round(9.0 / SIM_DT) + 1
    t = np.arange(c.num_steps) * c.dt
    np.testing.assert_allclose(c.ego_x, 10 + 10 * t, atol=1e-6)
    np.testing.assert_allclose(c.ego_y, 0.0, atol=1e-9)
    np.testing.assert_allclose(c.ego_speed, 10.0, atol=1e-5)
    assert (c.ego_length, c.ego_width) == pytest.approx((4.8, 2.1))
    # track 13 is never valid: dropped; the SDC (id 7) is the ego, not an agent
    assert c.agent_ids.tolist() == [11, 12]
    assert c.agent_types.tolist() == [AGENT_VEHICLE, AGENT_PEDESTRIAN]
    assert c.agent_length == pytest.approx([4.5, 0.5]) and c.agent_width == pytest.approx([1.9, 0.5])
    assert c.agent_valid[0].all()
    ped_t = np.flatnonzero(c.agent_valid[1]) * c.dt
    assert ped_t.min() == pytest.approx(2.0) and ped_t.max() == pytest.approx(6.0)
    np.testing.assert_allclose(c.agent_x[0], 30 + 8 * t, atol=1e-5)
    np.testing.assert_allclose(c.agent_vx[0], 8.0, atol=1e-5)
    np.testing.assert_allclose(c.agent_y[1][c.agent_valid[1]], ped_t, atol=1e-5)
    assert c.metadata["map"]["stop_signs"] == 1 and c.metadata["map"]["signals_without_lane"] == 0


def test_womd_lanes_neighbours_and_speed_limits(womd_clip):
    m = womd_clip.map
    assert m.lane_ids.tolist() == [100, 101, 102]
    assert m.successors == [[102], [], []]
    assert m.left_neighbors.tolist() == [101, NO_LANE, NO_LANE]
    assert m.right_neighbors.tolist() == [NO_LANE, 100, NO_LANE]
    # broken white line from lane 100 to the left; solid seen from lane 101 to the right
    assert m.lane_change_left.tolist() == [True, False, False]
    assert m.lane_change_right.tolist() == [False, False, False]
    sl = load_params("bev")["adapters"]["womd"]["default_speed_limits"]
    assert m.speed_limits == pytest.approx([25 * 0.44704, sl["surface_street"], sl["freeway"]])
    # boundaries: lane 100's are the referenced road line and edge; lane 101 references none (half a lane
    # width from its centreline); lane 102's left references nothing either
    np.testing.assert_allclose(m.left_boundaries[0][:, 1], LANE_W / 2, atol=1e-9)
    np.testing.assert_allclose(m.right_boundaries[0][:, 1], -LANE_W / 2 - 0.2, atol=1e-9)
    half = load_params("bev")["adapters"]["womd"]["default_lane_width_m"] / 2
    np.testing.assert_allclose(m.right_boundaries[1][:, 1], LANE_W - half, atol=1e-9)
    np.testing.assert_allclose(m.left_boundaries[2][:, 1], half, atol=1e-9)
    assert len(m.crosswalks) == 1 and len(m.drivable_areas) == 3
    assert womd_clip.route_lane_ids.tolist() == [100]  # the ego ends 100 m before the lane does


def test_womd_signal_states(womd_clip):
    c = womd_clip
    m = c.map
    assert m.signal_ids.tolist() == [102] and m.signal_lanes == [[102]]
    line = m.signal_stop_lines[0]
    width = load_params("bev")["adapters"]["womd"]["default_lane_width_m"]
    # across the lane (which runs along +x) at the stop point (200, 0), one lane width long
    np.testing.assert_allclose(line[:, 0], 200.0, atol=1e-9)
    assert sorted(line[:, 1]) == pytest.approx([-width / 2, width / 2])
    states = c.signal_states[0]
    go = int(round(GO_STEP * 0.1 / c.dt))
    assert (states[:go] == SIGNAL_RED).all() and (states[go:] == SIGNAL_GREEN).all()


def test_a_corrupt_record_is_named(womd_file, tmp_path):
    from rad2_datasets.adapters.womd import WOMDFormatError, iter_womd_clips

    raw = bytearray(womd_file.read_bytes())
    first_len = struct.unpack("<Q", raw[:8])[0]
    bad = tmp_path / "data_crc.tfrecord"
    raw_data = bytearray(raw)
    raw_data[12 + 100] ^= 0x01  # a bit inside record 0's payload
    bad.write_bytes(bytes(raw_data))
    with pytest.raises(WOMDFormatError, match=r"data_crc\.tfrecord: record 0: data CRC mismatch"):
        list(iter_womd_clips(bad, LOG_PARAMS))
    bad2 = tmp_path / "length_crc.tfrecord"
    raw_len = bytearray(raw)
    raw_len[12 + first_len + 4 + 8] ^= 0xFF  # record 1's length CRC
    bad2.write_bytes(bytes(raw_len))
    clips = iter_womd_clips(bad2, LOG_PARAMS)
    assert next(clips).clip_id == "womd_synthetic-0001"  # record 0 is intact
    with pytest.raises(WOMDFormatError, match=r"length_crc\.tfrecord: record 1: length CRC mismatch"):
        next(clips)
    truncated = tmp_path / "truncated.tfrecord"
    truncated.write_bytes(bytes(raw[: 12 + first_len // 2]))
    with pytest.raises(WOMDFormatError, match=r"truncated\.tfrecord: record 0: truncated data"):
        list(iter_womd_clips(truncated, LOG_PARAMS))


def test_wrong_timestamp_spacing_is_resampled_or_refused(tmp_path):
    from rad2_datasets.adapters.womd import WOMDFormatError, load_womd_scenario, write_tfrecord

    # the same scene declared at 5 Hz: twice as long, resampled to the simulator's step
    slow = write_tfrecord(
        tmp_path / "slow.tfrecord", [make_scenario(np.arange(STEPS) * 0.2).SerializeToString()]
    )
    c = load_womd_scenario(slow, params=LOG_PARAMS)
    assert c.dt == pytest.approx(SIM_DT) and c.metadata["resampled_from_dt"] == pytest.approx(0.2)
    assert c.duration_s == pytest.approx(18.0)
    # half way between the logged steps 1 and 2 (0.2 s and 0.4 s): ego x interpolated between 11 and 12
    k = int(round(0.3 / SIM_DT))
    assert c.ego_x[k] == pytest.approx(11.5)
    # the signal holds its last logged state: GO from logged step 50 = 10.0 s
    go = int(round(10.0 / SIM_DT))
    assert c.signal_states[0, go - 1] == SIGNAL_RED and c.signal_states[0, go] == SIGNAL_GREEN
    # uneven spacing cannot be one clip step: refused, naming file, record and field
    times = np.arange(STEPS) * 0.1
    times[40:] += 0.05
    uneven = write_tfrecord(tmp_path / "uneven.tfrecord", [make_scenario(times).SerializeToString()])
    with pytest.raises(
        WOMDFormatError,
        match=r"uneven\.tfrecord: record 0: timestamps_seconds: uneven spacing, "
        r"step 39->40",
    ):
        load_womd_scenario(uneven, params=LOG_PARAMS)


def test_bad_fields_are_named(tmp_path):
    from rad2_datasets.adapters.womd import WOMDFormatError, iter_womd_clips, write_tfrecord

    sc = make_scenario()
    sc.sdc_track_index = 9
    sc2 = make_scenario(scenario_id="short-track")
    del sc2.tracks[2].states[-1]
    path = write_tfrecord(
        tmp_path / "bad.tfrecord", [sc.SerializeToString(), sc2.SerializeToString(), b"\xff\xff"]
    )
    with pytest.raises(WOMDFormatError, match=r"bad\.tfrecord: record 0: sdc_track_index: 9"):
        list(iter_womd_clips(path, LOG_PARAMS))
    errors: list[str] = []
    assert list(iter_womd_clips(path, LOG_PARAMS, errors=errors)) == []
    assert "record 1: tracks[2] (id 12).states: 90 entries, expected 91" in errors[1]
    assert "record 2: not a waymo.open_dataset.Scenario" in errors[2]


def test_the_clip_spans_the_valid_sdc_states(tmp_path):
    from rad2_datasets.adapters.womd import load_womd_scenario, write_tfrecord

    sc = make_scenario()
    sdc = sc.tracks[sc.sdc_track_index].states
    for k in (0, 1, 2, 3, 4, 30, 31, 32):
        sdc[k].valid = False
    c = load_womd_scenario(write_tfrecord(tmp_path / "gap.tfrecord", [sc.SerializeToString()]),
                           params=LOG_PARAMS)
    assert c.metadata["ego_valid_steps"] == [5, STEPS - 1] and c.metadata["ego_interpolated_steps"] == 3
    assert c.metadata["current_time_index"] == 10 - 5
    assert c.num_steps == round((STEPS - 1 - 5) * 0.1 / SIM_DT) + 1
    t = (5 + np.arange(c.num_steps) * c.dt / 0.1) * 0.1  # log time of each clip step
    np.testing.assert_allclose(c.ego_x, 10 + 10 * t, atol=1e-6)  # the gap is interpolated along the drive
    assert c.signal_states.shape == (1, c.num_steps) and c.signal_states[0, 0] == SIGNAL_RED
    ped_t = 0.5 + np.flatnonzero(c.agent_valid[1]) * c.dt
    assert ped_t.min() == pytest.approx(2.0) and ped_t.max() == pytest.approx(6.0)


def test_convert_womd_cli(womd_file, tmp_path):
    out = tmp_path / "ds"
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "rad2_bringup.cli",
            "data",
            "convert",
            str(womd_file),
            "--format",
            "womd",
            "--out",
            str(out),
            "--no-progress",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr
    clips = load_dataset(out)
    assert sorted(c.clip_id for c in clips) == ["womd_synthetic-0001", "womd_synthetic-0002"]
    assert clips[0].signal_states is not None and clips[0].map.has_adjacency
    res = subprocess.run(
        [sys.executable, "-m", "rad2_bringup.cli", "data", "convert", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert (
        res.returncode == 0 and "usage:" in res.stdout and not any(p.name != "ds" for p in tmp_path.iterdir())
    )


# ---------------------------------------------------------------------------------------------------------
# Argoverse 2 sensor logs
# ---------------------------------------------------------------------------------------------------------
def _quat_z(yaw):
    return np.cos(np.asarray(yaw) / 2), np.sin(np.asarray(yaw) / 2)  # (qw, qz) of a rotation about +z


@pytest.fixture(scope="module")
def sensor_log(tmp_path_factory):
    """A sensor log along the fixture scenario's ego path: poses at 20 Hz, annotation sweeps at 10 Hz with
    a few ms of jitter; a car 10 m ahead of the ego and a pedestrian standing still in sweeps 10..40."""
    import pandas as pd
    from rad2_datasets.adapters.av2 import find_scenario_files

    parquet, map_json = find_scenario_files(AV2_DIR)
    df = pd.read_parquet(parquet)
    ego = df[df["track_id"] == "AV"].sort_values("timestep")
    x, y, yaw = (ego[c].to_numpy(np.float64) for c in ("position_x", "position_y", "heading"))
    n = len(x)
    t0 = 315_969_000_000_000_000
    t_ns = t0 + np.arange(n, dtype=np.int64) * 100_000_000
    # 20 Hz poses: the 10 Hz ones plus midpoints (camera-rate poses in a real log)
    mid_t = (t_ns[:-1] + t_ns[1:]) // 2
    uyaw = np.unwrap(yaw)
    pt = np.concatenate([t_ns, mid_t])
    px = np.concatenate([x, 0.5 * (x[:-1] + x[1:])])
    py = np.concatenate([y, 0.5 * (y[:-1] + y[1:])])
    pyaw = np.concatenate([uyaw, 0.5 * (uyaw[:-1] + uyaw[1:])])
    qw, qz = _quat_z(pyaw)
    log = tmp_path_factory.mktemp("av2_sensor") / "log-0001"
    (log / "map").mkdir(parents=True)
    shutil.copy(map_json, log / "map" / Path(map_json).name)
    pd.DataFrame(
        {"timestamp_ns": pt, "qw": qw, "qx": 0.0, "qy": 0.0, "qz": qz, "tx_m": px, "ty_m": py, "tz_m": 20.0}
    ).to_feather(log / "city_SE3_egovehicle.feather")
    rows = []
    jitter = np.array([0, 3, -2, 4, -4]) * 1_000_000
    ped_city, ped_yaw = np.array([x[25] + 3.0, y[25] - 4.0]), 0.5
    for k in range(n):
        ts = int(t_ns[k] + jitter[k % 5])
        # ego pose at the sweep's own time (linear between the 10 Hz samples)
        f = (ts - t_ns[k]) / 1e8
        j = min(k + 1, n - 1) if f >= 0 else max(k - 1, 0)
        ex, ey = x[k] + abs(f) * (x[j] - x[k]), y[k] + abs(f) * (y[j] - y[k])
        eyaw = uyaw[k] + abs(f) * (uyaw[j] - uyaw[k])
        cqw, cqz = _quat_z(0.1)
        rows.append(
            ("a0f1c2d3-0000-4000-8000-000000000001", "REGULAR_VEHICLE", 4.6, 1.9, cqw, cqz, 10.0, 0.0, ts)
        )
        if 10 <= k <= 40:
            d = ped_city - [ex, ey]
            c, s = np.cos(eyaw), np.sin(eyaw)
            local = (c * d[0] + s * d[1], -s * d[0] + c * d[1])
            pqw, pqz = _quat_z(ped_yaw - eyaw)
            rows.append(
                ("b0f1c2d3-0000-4000-8000-000000000002", "PEDESTRIAN", 0.7, 0.6, pqw, pqz, *local, ts)
            )
    a = pd.DataFrame(
        rows,
        columns=["track_uuid", "category", "length_m", "width_m", "qw", "qz", "tx_m", "ty_m", "timestamp_ns"],
    )
    a["height_m"], a["qx"], a["qy"], a["tz_m"], a["num_interior_pts"] = 1.5, 0.0, 0.0, 0.5, 100
    a.to_feather(log / "annotations.feather")
    return log, (x, y, uyaw), ped_city, ped_yaw


def test_av2_sensor_log_agents_in_city_frame(sensor_log):
    from rad2_datasets.adapters.av2_sensor import load_av2_sensor_log

    log, (x, y, yaw), ped_city, ped_yaw = sensor_log
    c = load_av2_sensor_log(log, LOG_PARAMS).validate()
    assert c.metadata["source"] == "av2_sensor" and c.clip_id == "av2s_log-0001"
    assert c.dt == pytest.approx(SIM_DT) and c.duration_s == pytest.approx((len(x) - 1) * 0.1)
    assert c.metadata["steps_without_sweep"] == 0 and c.metadata["sweeps_off_grid"] == 0
    k10 = np.arange(len(x)) * round(0.1 / SIM_DT)  # clip steps at the 10 Hz samples
    np.testing.assert_allclose(c.ego_x[k10], x, atol=1e-6)
    np.testing.assert_allclose(c.ego_y[k10], y, atol=1e-6)
    assert c.agent_types.tolist() == [AGENT_VEHICLE, AGENT_PEDESTRIAN]
    assert c.agent_length == pytest.approx([4.6, 0.7]) and c.agent_width == pytest.approx([1.9, 0.6])
    car, ped = 0, 1
    # the car rides 10 m ahead of the ego along its heading (to within the sweeps' few ms of jitter)
    ahead = np.stack([c.ego_x + 10 * np.cos(c.ego_yaw), c.ego_y + 10 * np.sin(c.ego_yaw)], axis=1)
    got = np.stack([c.agent_x[car], c.agent_y[car]], axis=1)
    assert np.abs(got - ahead).max() < 0.1
    assert np.abs(np.angle(np.exp(1j * (c.agent_yaw[car] - c.ego_yaw - 0.1)))).max() < 0.01
    # its velocity, differenced from the city positions, matches the ego's speed
    speed = np.hypot(c.agent_vx[car], c.agent_vy[car])
    moving = c.ego_speed > 2.0
    assert np.median(np.abs(speed[moving] - c.ego_speed[moving])) < 0.3
    # the pedestrian stands at one city point, facing ped_yaw, in sweeps 10..40 only
    v = c.agent_valid[ped]
    assert np.flatnonzero(v).min() * c.dt == pytest.approx(1.0) and np.flatnonzero(
        v
    ).max() * c.dt == pytest.approx(4.0)
    np.testing.assert_allclose(c.agent_x[ped][v], ped_city[0], atol=1e-6)
    np.testing.assert_allclose(c.agent_y[ped][v], ped_city[1], atol=1e-6)
    np.testing.assert_allclose(c.agent_yaw[ped][v], ped_yaw, atol=1e-6)
    assert np.abs(c.agent_vx[ped][v]).max() < 1e-6
    assert c.map.has_adjacency and c.route_lane_ids.size > 0


def test_av2_sensor_log_errors_name_file_and_column(sensor_log, tmp_path):
    import pandas as pd
    from rad2_datasets.adapters.av2_sensor import AV2SensorFormatError, load_av2_sensor_log

    log = tmp_path / "log"
    shutil.copytree(sensor_log[0], log)
    ann = pd.read_feather(log / "annotations.feather")
    ann.drop(columns=["qz"]).to_feather(log / "annotations.feather")
    with pytest.raises(AV2SensorFormatError, match=r"annotations\.feather: missing columns \['qz'\]"):
        load_av2_sensor_log(log, LOG_PARAMS)
    ann.to_feather(log / "annotations.feather")
    poses = pd.read_feather(log / "city_SE3_egovehicle.feather")
    poses.iloc[:5].to_feather(log / "city_SE3_egovehicle.feather")
    with pytest.raises(
        AV2SensorFormatError, match=r"city_SE3_egovehicle\.feather: timestamp_ns: no ego pose"
    ):
        load_av2_sensor_log(log, LOG_PARAMS)
    (log / "annotations.feather").unlink()
    with pytest.raises(AV2SensorFormatError, match=r"annotations\.feather: missing"):
        load_av2_sensor_log(log, LOG_PARAMS)


# ---------------------------------------------------------------------------------------------------------
# Argoverse 2 map adjacency
# ---------------------------------------------------------------------------------------------------------
def test_av2_map_adjacency_from_the_real_archive(tmp_path):
    from rad2_datasets.adapters.av2 import AV2FormatError, find_scenario_files, load_av2_map

    _, map_json = find_scenario_files(AV2_DIR)
    m, _ = load_av2_map(map_json, LOG_PARAMS)
    m.validate()
    segs = {int(s["id"]): s for s in json.loads(Path(map_json).read_text())["lane_segments"].values()}
    idx = m.lane_index()
    with_nb = [
        (side, int(lid), nb)
        for side, arr in (("left", m.left_neighbors), ("right", m.right_neighbors))
        for lid, nb in zip(m.lane_ids, arr)
        if nb != NO_LANE
    ]
    assert len(with_nb) >= 1
    permitted = 0
    for side, lid, nb in with_nb:
        assert segs[lid][f"{side}_neighbor_id"] == nb  # from the archive, not invented
        d1 = m.centerlines[idx[lid]][-1] - m.centerlines[idx[lid]][0]
        d2 = m.centerlines[idx[int(nb)]][-1] - m.centerlines[idx[int(nb)]][0]
        assert d1 @ d2 > 0, "neighbours run the same way"
        allowed = bool((m.lane_change_left if side == "left" else m.lane_change_right)[idx[lid]])
        mark = segs[lid][f"{side}_lane_mark_type"]
        assert allowed == mark.startswith(("DASHED_", "DOUBLE_DASH_")), (lid, side, mark)
        permitted += allowed
    assert permitted >= 1
    # e.g. lane 205119390: a dashed white line to its right neighbour (allowed), the lane across the double
    # solid yellow centre line on its left runs the other way (no neighbour)
    assert m.neighbor(205119390, "right") == 205119623 and m.lane_change_right[idx[205119390]]
    assert segs[205119390]["left_neighbor_id"] == 205119535 and m.neighbor(205119390, "left") is None
    # a solid white line: neighbours, but no lane change
    assert m.neighbor(205119377, "left") == 205119494 and not m.lane_change_left[idx[205119377]]
    archive = json.loads(Path(map_json).read_text())
    archive["lane_segments"]["205119390"]["right_lane_mark_type"] = "ZIGZAG"
    bad = tmp_path / "log_map_archive_bad.json"
    bad.write_text(json.dumps(archive))
    with pytest.raises(
        AV2FormatError,
        match=r"log_map_archive_bad\.json: lane segment 205119390: field "
        r"'right_lane_mark_type' = 'ZIGZAG'",
    ):
        load_av2_map(bad, LOG_PARAMS)
    archive["lane_segments"]["205119390"]["right_lane_mark_type"] = "DASHED_WHITE"
    archive["lane_segments"]["205119390"]["successors"] = ["next"]
    bad.write_text(json.dumps(archive))
    with pytest.raises(AV2FormatError, match=r"lane segment 205119390: field 'successors'"):
        load_av2_map(bad, LOG_PARAMS)
