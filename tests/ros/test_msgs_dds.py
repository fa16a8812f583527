"""Two separate processes exchange every rad2_msgs message over real Fast DDS (loopback only).

The echo process republishes whatever it receives; the probe process publishes content built with
rad2_ros.conversions (including a 10x128x128 BEV tensor), decodes the echoes and dumps them.
This test compares the dump with content it generates itself, exactly (float rounding only where a
heading passes through atan2/cos/sin).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest
from rad2_core.config import load_params
from rad2_ros import msg_roundtrip
from rad2_ros.rosenv import rad2_variables
from ros_process import ROOT, RosProcess, require_ros_build, ros_env, unique_domain_id

SMOKE = ["-m", "rad2_bringup.cli", "graph", "smoke"]  # rad2 graph smoke, in the child's python
BEV_CHANNELS = 10
BEV_SIZE = 128
SEED = 3
BEV_PARAMS = load_params("bev")


@pytest.fixture(scope="module")
def dds_exchange(tmp_path_factory):
    require_ros_build()
    log_dir = tmp_path_factory.mktemp("dds")
    dump = log_dir / "replies.npz"
    env = ros_env(unique_domain_id())
    common = ["--seed", str(SEED), "--bev-channels", str(BEV_CHANNELS), "--bev-size", str(BEV_SIZE)]
    with RosProcess([*SMOKE, "echo", "--timeout", "120"], env, name="echo", log_dir=log_dir) as echo:
        echo.wait_for_output(msg_roundtrip.READY_LINE, timeout=60)
        with RosProcess(
            [*SMOKE, "probe", "--count", "3", "--timeout", "60", "--dump", str(dump), *common],
            env,
            name="probe",
            log_dir=log_dir,
        ) as probe:
            code = probe.wait(timeout=120)
            log = probe.log()
        echo_alive = echo.poll() is None
    return {"code": code, "log": log, "dump": dump, "echo_alive": echo_alive}


def test_every_message_type_round_trips_between_two_processes(dds_exchange):
    assert dds_exchange["echo_alive"], "the echo process died during the exchange"
    results = msg_roundtrip.parse_probe_output(dds_exchange["log"])
    assert [r["type"] for r in results] == list(msg_roundtrip.MESSAGE_TYPES)
    failed = {r["type"]: r["problems"] for r in results if not r["ok"]}
    assert not failed, f"types that did not round-trip: {failed}\nprobe log:\n{dds_exchange['log'][-3000:]}"
    assert dds_exchange["code"] == 0
    for r in results:
        assert len(r["rtt_ms"]) == 3 and all(0 < t < 5000 for t in r["rtt_ms"]), r
    bev = next(r for r in results if r["type"] == "BevFeatures")
    assert bev["bytes"] >= BEV_CHANNELS * BEV_SIZE * BEV_SIZE * 4


def test_received_content_equals_generated_content(dds_exchange):
    arrays = msg_roundtrip.sample_arrays(BEV_PARAMS, SEED, BEV_CHANNELS, BEV_SIZE)
    with np.load(dds_exchange["dump"]) as dump:
        received = {key: dump[key] for key in dump.files}
    for type_name in msg_roundtrip.MESSAGE_TYPES:
        expected = msg_roundtrip.expected_content(type_name, arrays)
        got = {
            key.split("/", 1)[1]: value for key, value in received.items() if key.startswith(type_name + "/")
        }
        assert got, f"nothing received for {type_name}"
        problems = msg_roundtrip.compare_content(expected, got, msg_roundtrip.APPROX_KEYS)
        assert not problems, f"{type_name}: {problems}"

    # The BEV tensor came back bit-identical and is not trivially simple content.
    features = received["BevFeatures/features"]
    assert features.shape == (BEV_CHANNELS, BEV_SIZE, BEV_SIZE) and features.dtype == np.float32
    np.testing.assert_array_equal(features, arrays["bev"]["features"])
    channels = list(received["BevFeatures/channel_names"])
    assert channels == arrays["bev"]["channel_names"]
    drivable = features[channels.index("drivable_area")]
    assert 0.05 < drivable.mean() < 0.6
    assert features[channels.index("agents_t0")].sum() > 20
    assert len(np.unique(features[channels.index("agent_velocity_x")])) >= 3


def test_compare_content_detects_a_changed_value():
    arrays = msg_roundtrip.sample_arrays(BEV_PARAMS, SEED, BEV_CHANNELS, BEV_SIZE)
    expected = msg_roundtrip.expected_content("BevFeatures", arrays)
    tampered = dict(expected, features=expected["features"].copy())
    tampered["features"][4, 60, 70] += np.float32(1e-3)
    assert msg_roundtrip.compare_content(expected, tampered) == ["features: values differ"]


def test_env_sh_is_set_u_safe_and_agrees_with_rosenv(tmp_path):
    require_ros_build()
    script = (
        "set -euo pipefail; source tools/env.sh; "
        'python -c "import os, rad2_msgs.msg, rclpy; '
        "print(os.environ['RMW_IMPLEMENTATION'], os.environ['FASTDDS_DEFAULT_PROFILES_FILE'], "
        "os.environ['ROS_AUTOMATIC_DISCOVERY_RANGE'], os.environ['RAD2_ROOT'])\""
    )
    # A bare login-like environment: everything ROS must come from env.sh.
    bare = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(tmp_path), "LANG": "C.UTF-8"}
    out = subprocess.run(
        ["bash", "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120, env=bare
    )
    assert out.returncode == 0, out.stderr
    fixed = rad2_variables()
    assert out.stdout.split() == [
        fixed["RMW_IMPLEMENTATION"],
        fixed["FASTDDS_DEFAULT_PROFILES_FILE"],
        fixed["ROS_AUTOMATIC_DISCOVERY_RANGE"],
        str(ROOT),
    ]
    assert Path(fixed["FASTDDS_DEFAULT_PROFILES_FILE"]).is_file()
    # the rad2 command is on the PATH env.sh gives (the colcon install's bin, through its hooks)
    which = subprocess.run(["bash", "-c", "set -euo pipefail; source tools/env.sh; command -v rad2"],
                           cwd=ROOT, capture_output=True, text=True, timeout=120, env=bare)
    assert which.returncode == 0, which.stderr
    assert which.stdout.strip() == str(ROOT / "ros2_ws" / "install" / "rad2_bringup" / "bin" / "rad2")


def test_ros_env_rejects_invalid_domain_id():
    require_ros_build()
    with pytest.raises(ValueError, match="domain_id must be in 0..232.*got 300"):
        ros_env(300)
