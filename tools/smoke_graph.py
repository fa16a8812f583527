#!/usr/bin/env python3
"""ROS 2 graph smoke check: two processes exchange every rad2_msgs message type over Fast DDS.

Default (orchestrator): starts an `echo` process (subscribes to /rad2_smoke/request/<Type> and
republishes each message on /rad2_smoke/reply/<Type>) and a `probe` process (publishes realistic
content built with rad2_planner.ros_conversions, waits for each echo, checks that the content came
back unchanged by decoding it again, and measures the round-trip time), then prints one line per
message type: serialized size, round-trip latency (median / p95 / max) and whether the content
round-tripped. Exit code 0 only when every type round-tripped.

The content, its encoding/decoding and the result line are rad2_planner.msg_roundtrip (shared with the
tests, which compare what the probe received with the same content); the child processes are
tools/rosenv.py's RosProcess.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from rad2_planner.config import load_params
from rad2_planner.msg_roundtrip import (
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
from rad2_planner.rosenv import RosProcess, RosProcessError, ros_env


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


def run_probe(args: argparse.Namespace) -> int:
    import rad2_msgs.msg as rad2_msg
    import rclpy
    from rad2_planner import ros_conversions as rc
    from rclpy.serialization import deserialize_message, serialize_message

    arrays = sample_arrays(args.seed, args.bev_channels, args.bev_size)
    sizes = rc.TokenSizes.from_params(load_params("bev")["tokens"])
    messages = build_messages(arrays)
    rclpy.init()
    node = rclpy.create_node("rad2_smoke_probe")
    received: dict[str, list] = {t: [] for t in MESSAGE_TYPES}
    pubs, subs = {}, []
    for type_name in MESSAGE_TYPES:
        msg_type = getattr(rad2_msg, type_name)
        pubs[type_name] = node.create_publisher(msg_type, REQUEST_PREFIX + type_name, _reliable_qos())
        subs.append(
            node.create_subscription(
                msg_type,
                REPLY_PREFIX + type_name,
                lambda m, t=type_name: received[t].append((time.perf_counter(), m)),
                _reliable_qos(),
            )
        )
    results, dump = [], {}
    deadline = time.monotonic() + args.timeout
    try:
        for type_name in MESSAGE_TYPES:
            msg = messages[type_name]
            result = {
                "type": type_name,
                "bytes": len(serialize_message(msg)),
                "rtt_ms": [],
                "ok": False,
                "problems": [],
            }
            results.append(result)
            # Discovery first: both directions matched before timing anything.
            while time.monotonic() < deadline and (
                pubs[type_name].get_subscription_count() < 1
                or subs[MESSAGE_TYPES.index(type_name)].get_publisher_count() < 1
            ):
                rclpy.spin_once(node, timeout_sec=0.02)
            rounds = 0
            while rounds < args.count + 1 and time.monotonic() < deadline:
                received[type_name].clear()
                sent_at = time.perf_counter()
                pubs[type_name].publish(msg)
                retry_at = time.monotonic() + 1.0  # a reply lost before the reverse match completed
                while not received[type_name] and time.monotonic() < min(deadline, retry_at):
                    rclpy.spin_once(node, timeout_sec=0.005)
                if not received[type_name]:
                    continue
                got_at, reply = received[type_name][0]
                if rounds == 0:  # warm-up round: check the content, do not time it
                    decoded = decode_content(type_name, reply, sizes)
                    problems = compare_content(expected_content(type_name, arrays), decoded, APPROX_KEYS)
                    # float32 fields hold Python floats until serialized: compare with the local
                    # serialize/deserialize image of what was sent.
                    if reply != deserialize_message(serialize_message(msg), type(msg)):
                        problems.append("message fields differ from what was sent")
                    result["problems"] = problems
                    dump |= {f"{type_name}/{k}": np.asarray(v) for k, v in decoded.items()}
                else:
                    result["rtt_ms"].append((got_at - sent_at) * 1e3)
                rounds += 1
            result["ok"] = not result["problems"] and len(result["rtt_ms"]) == args.count
            if len(result["rtt_ms"]) < args.count:
                result["problems"].append(
                    f"only {len(result['rtt_ms'])} of {args.count} round trips before timeout"
                )
    finally:
        node.destroy_node()
        rclpy.try_shutdown()
    if args.dump:
        np.savez(args.dump, **dump)
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


def run_orchestrator(args: argparse.Namespace) -> int:
    env = ros_env(args.domain_id)
    here = str(Path(__file__).resolve())
    common = ["--seed", str(args.seed), "--timeout", str(args.timeout)]
    if args.bev_channels is not None:
        common += ["--bev-channels", str(args.bev_channels)]
    if args.bev_size is not None:
        common += ["--bev-size", str(args.bev_size)]
    print(
        f"[smoke] two processes on ROS_DOMAIN_ID={env['ROS_DOMAIN_ID']}, {env['RMW_IMPLEMENTATION']}, "
        f"profile {Path(env['FASTDDS_DEFAULT_PROFILES_FILE']).name}; {args.count} round trips per type"
    )
    with RosProcess([here, "echo", "--timeout", str(args.timeout + 30)], env, name="echo") as echo:
        try:
            echo.wait_for_output(READY_LINE, timeout=60)
            with RosProcess([here, "probe", "--count", str(args.count), *common], env, name="probe") as probe:
                code = probe.wait(timeout=args.timeout + 60)
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Run inside the ROS environment: source tools/env.sh (make demo does).",
    )
    parser.add_argument(
        "role",
        nargs="?",
        choices=("run", "echo", "probe"),
        default="run",
        help="run (default): start echo + probe and print the table; echo/probe: one side",
    )
    parser.add_argument(
        "--count", type=int, default=20, help="timed round trips per message type (default 20)"
    )
    parser.add_argument("--seed", type=int, default=0, help="content seed (default 0)")
    parser.add_argument(
        "--bev-channels", type=int, default=None, help="BEV channel count (default: params/bev.yaml)"
    )
    parser.add_argument(
        "--bev-size", type=int, default=None, help="square BEV grid size (default: params/bev.yaml)"
    )
    parser.add_argument(
        "--timeout", type=float, default=60.0, help="overall seconds for the exchange (default 60)"
    )
    parser.add_argument(
        "--domain-id", type=int, default=None, help="ROS_DOMAIN_ID (default: derived from the pid)"
    )
    parser.add_argument(
        "--dump", type=Path, default=None, help="probe: write the decoded replies to this .npz"
    )
    args = parser.parse_args(argv)
    if args.count < 1:
        parser.error(f"--count must be >= 1, got {args.count}")
    if args.role == "echo":
        return run_echo(args.timeout)
    if args.role == "probe":
        return run_probe(args)
    return run_orchestrator(args)


if __name__ == "__main__":
    sys.exit(main())
