"""ROS 2 graph smoke check: two processes exchange every rad2_msgs message type over Fast DDS.

The library side of ``rad2 graph smoke``: :func:`run_echo` (republish each request as a reply),
:func:`run_probe` (publish realistic content, check the echo decodes to the same content, time the round
trips) and :func:`run_orchestrator` (both as child processes of the CLI, then the table). The content,
its encoding/decoding and the result line are rad2_ros.msg_roundtrip; rclpy is imported where used.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from rad2_core.config import load_params
from rad2_ros.msg_roundtrip import (
    APPROX_KEYS,
    MESSAGE_TYPES,
    READY_LINE,
    REPLY_PREFIX,
    REQUEST_PREFIX,
    RESULT_PREFIX,
    build_messages,
    compare_content,
    decode_content,
    expected_content,
    parse_probe_output,
    sample_arrays,
)
from rad2_ros.rosenv import RosProcess, RosProcessError, ros_env

#: The CLI whose echo / probe roles the orchestrator starts as child processes.
# How the orchestrator starts its two roles: ``rad2 graph smoke echo`` / ``probe`` in the child's python.
SMOKE_COMMAND = ["-m", "rad2_bringup.cli", "graph", "smoke"]


def _reliable_qos():
    from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy

    return QoSProfile(
        reliability=ReliabilityPolicy.RELIABLE,
        history=HistoryPolicy.KEEP_LAST,
        depth=4,
        durability=DurabilityPolicy.VOLATILE,
    )


def run_echo(timeout_s: float) -> int:
    import rad2_msgs.msg as rad2_msg
    import rclpy
    from rclpy.executors import ExternalShutdownException

    rclpy.init()
    node = rclpy.create_node("rad2_smoke_echo")
    keep = []
    for type_name in MESSAGE_TYPES:
        msg_type = getattr(rad2_msg, type_name)
        pub = node.create_publisher(msg_type, REPLY_PREFIX + type_name, _reliable_qos())
        keep.append(
            node.create_subscription(
                msg_type, REQUEST_PREFIX + type_name, lambda m, p=pub: p.publish(m), _reliable_qos()
            )
        )
        keep.append(pub)
    print(READY_LINE, flush=True)
    deadline = time.monotonic() + timeout_s
    try:
        while rclpy.ok() and time.monotonic() < deadline:
            rclpy.spin_once(node, timeout_sec=0.1)
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    finally:
        node.destroy_node()
        rclpy.try_shutdown()
    return 0


def _probe_endpoints(node: Any, inbox: dict[str, list]) -> tuple[dict[str, Any], dict[str, Any]]:
    """A request publisher and a reply subscription (appending (arrival, msg) to inbox) per type."""
    import rad2_msgs.msg as rad2_msg

    pubs, subs = {}, {}
    for type_name in MESSAGE_TYPES:
        msg_type = getattr(rad2_msg, type_name)
        pubs[type_name] = node.create_publisher(msg_type, REQUEST_PREFIX + type_name, _reliable_qos())
        subs[type_name] = node.create_subscription(
            msg_type,
            REPLY_PREFIX + type_name,
            lambda m, t=type_name: inbox[t].append((time.perf_counter(), m)),
            _reliable_qos(),
        )
    return pubs, subs


def _check_reply(type_name: str, msg: Any, reply: Any, arrays: dict[str, Any], sizes: Any,
                 dump: dict[str, np.ndarray]) -> list[str]:
    """Problems of one reply's content (decoded again and compared); the decoded arrays go to dump."""
    from rclpy.serialization import deserialize_message, serialize_message

    decoded = decode_content(type_name, reply, sizes)
    problems = compare_content(expected_content(type_name, arrays), decoded, APPROX_KEYS)
    # float32 fields hold Python floats until serialized: compare with the local
    # serialize/deserialize image of what was sent.
    if reply != deserialize_message(serialize_message(msg), type(msg)):
        problems.append("message fields differ from what was sent")
    dump |= {f"{type_name}/{k}": np.asarray(v) for k, v in decoded.items()}
    return problems


def _round_trips(node: Any, pub: Any, sub: Any, inbox: list, msg: Any, type_name: str, count: int,
                 deadline: float, check: Callable[[Any], list[str]]) -> dict[str, Any]:
    """Discovery, one checked warm-up round, then ``count`` timed round trips of one message type."""
    import rclpy
    from rclpy.serialization import serialize_message

    result = {"type": type_name, "bytes": len(serialize_message(msg)), "rtt_ms": [], "ok": False,
              "problems": []}
    # Discovery first: both directions matched before timing anything.
    while time.monotonic() < deadline and (pub.get_subscription_count() < 1 or sub.get_publisher_count() < 1):
        rclpy.spin_once(node, timeout_sec=0.02)
    rounds = 0
    while rounds < count + 1 and time.monotonic() < deadline:
        inbox.clear()
        sent_at = time.perf_counter()
        pub.publish(msg)
        retry_at = time.monotonic() + 1.0  # a reply lost before the reverse match completed
        while not inbox and time.monotonic() < min(deadline, retry_at):
            rclpy.spin_once(node, timeout_sec=0.005)
        if not inbox:
            continue
        got_at, reply = inbox[0]
        if rounds == 0:  # warm-up round: check the content, do not time it
            result["problems"] = check(reply)
        else:
            result["rtt_ms"].append((got_at - sent_at) * 1e3)
        rounds += 1
    result["ok"] = not result["problems"] and len(result["rtt_ms"]) == count
    if len(result["rtt_ms"]) < count:
        result["problems"].append(f"only {len(result['rtt_ms'])} of {count} round trips before timeout")
    return result


def run_probe(seed: int, count: int, timeout: float, bev_channels: int | None = None,
              bev_size: int | None = None, dump_path: str | Path | None = None) -> int:
    """The probe side: publish every type, check and time the echoes, print the result line."""
    import rclpy
    from rad2_ros import conversions as rc

    bev_params = load_params("bev")
    arrays = sample_arrays(bev_params, seed, bev_channels, bev_size)
    sizes = rc.TokenSizes.from_params(bev_params["tokens"])
    messages = build_messages(arrays)
    rclpy.init()
    node = rclpy.create_node("rad2_smoke_probe")
    inbox: dict[str, list] = {t: [] for t in MESSAGE_TYPES}
    pubs, subs = _probe_endpoints(node, inbox)
    results, dump = [], {}
    deadline = time.monotonic() + timeout
    try:
        for t in MESSAGE_TYPES:
            msg = messages[t]
            results.append(_round_trips(
                node, pubs[t], subs[t], inbox[t], msg, t, count, deadline,
                lambda reply, t=t, msg=msg: _check_reply(t, msg, reply, arrays, sizes, dump)))
    finally:
        node.destroy_node()
        rclpy.try_shutdown()
    if dump_path:
        np.savez(dump_path, **dump)
    print(RESULT_PREFIX + json.dumps(results), flush=True)
    return 0 if all(r["ok"] for r in results) else 1


def print_table(results: list[dict]) -> None:
    print(f"{'message':<20} {'bytes':>9} {'rtt median':>11} {'p95':>8} {'max':>8}  content")
    for r in results:
        rtt = sorted(r["rtt_ms"])
        if rtt:
            p95 = rtt[min(len(rtt) - 1, math.ceil(0.95 * len(rtt)) - 1)]
            timing = f"{statistics.median(rtt):>8.2f} ms {p95:>5.2f} ms {rtt[-1]:>5.2f} ms"
        else:
            timing = f"{'-':>11} {'-':>8} {'-':>8}"
        status = "round-trips" if r["ok"] else "FAILED: " + "; ".join(r["problems"])
        print(f"{r['type']:<20} {r['bytes']:>9} {timing}  {status}")


def run_orchestrator(count: int, seed: int, timeout: float, bev_channels: int | None = None,
                     bev_size: int | None = None, domain_id: int | None = None) -> int:
    """Start the echo and the probe (``rad2 graph smoke echo`` / ``probe``) as two processes in the ROS
    environment, print the table; 0 when every type round-tripped."""
    env = ros_env(domain_id)
    common = ["--seed", str(seed), "--timeout", str(timeout)]
    if bev_channels is not None:
        common += ["--bev-channels", str(bev_channels)]
    if bev_size is not None:
        common += ["--bev-size", str(bev_size)]
    print(
        f"[smoke] two processes on ROS_DOMAIN_ID={env['ROS_DOMAIN_ID']}, {env['RMW_IMPLEMENTATION']}, "
        f"profile {Path(env['FASTDDS_DEFAULT_PROFILES_FILE']).name}; {count} round trips per type"
    )
    with RosProcess([*SMOKE_COMMAND, "echo", "--timeout", str(timeout + 30)], env, name="echo") as echo:
        try:
            echo.wait_for_output(READY_LINE, timeout=60)
            probe_args = [*SMOKE_COMMAND, "probe", "--count", str(count), *common]
            with RosProcess(probe_args, env, name="probe") as probe:
                code = probe.wait(timeout=timeout + 60)
                log = probe.log()
        except RosProcessError as err:
            print(f"[smoke] FAILED: {err}", file=sys.stderr)
            return 1
    try:
        results = parse_probe_output(log)
    except ValueError:
        print(
            f"[smoke] FAILED: probe exited with {code} without a result; log:\n{log[-3000:]}", file=sys.stderr
        )
        return 1
    print_table(results)
    ok = code == 0 and all(r["ok"] for r in results)
    print(
        f"[smoke] {'OK' if ok else 'FAILED'}: {sum(r['ok'] for r in results)}/{len(results)} message types "
        "round-tripped over DDS between two processes"
    )
    return 0 if ok else 1
