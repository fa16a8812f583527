"""The clock model of stamped inputs (``supervision.StampClock``) and the odometry gate on top of it.

The faults of an adversarial run, at the gate: odometry stamps that jump back 2 s or forward 10 s for
0.5 s used to be confirmed as a relocalisation after 3 samples; a single +10 s sample was accepted and
the valid samples after it rejected as out of order; a +1 h stamp was accepted. Each is now a named
clock fault (field, offset, tolerance) for every sample it affects, never a reset, and the valid
stream resumes without one.
"""

from __future__ import annotations

import pytest
from rad2_core.config import load_params
from rad2_core.supervision import ClockLimits, OdometryGate, StampClock
from rad2_core.validators import load_limits
from rad2_ros.conversions import EgoMotion as Motion

LIMITS = load_limits(load_params("validators"))
CLOCK = LIMITS["clock"]
MS = 1_000_000
S = 1_000_000_000
PERIOD = 20 * MS  # odometry at 50 Hz
LATENCY = 3 * MS  # delivery: the node clock reads this much after the stamp


def gate(confirm: int = 3, sim: bool = False) -> OdometryGate:
    clock = StampClock("odometry.header.stamp", ClockLimits.from_params(CLOCK, use_sim_time=sim))
    return OdometryGate(LIMITS, confirm, clock)


def sample(k: int, t0: int = 100 * S, x0: float = 0.0, v: float = 10.0,
           shift_ns: int = 0) -> tuple[Motion, int]:
    """The k-th sample of a 10 m/s drive and the node clock when it arrives; ``shift_ns`` moves only
    its stamp (a clock fault of the sender), not where the ego is or when the sample arrives."""
    t = t0 + k * PERIOD
    return Motion(x0 + v * (t - t0) / 1e9, 0.0, 0.0, v, 0.0, t + shift_ns), t + LATENCY


def run(g: OdometryGate, ks, **kw):
    return [g.offer(*sample(k, **kw)) for k in ks]


@pytest.mark.parametrize(("shift_s", "kind", "text"), [
    (-2.0, "stale", "behind the node clock"),
    (10.0, "future", "ahead of the node clock"),
    (3600.0, "future", "ahead of the node clock"),
])
def test_a_clock_fault_burst_is_rejected_by_name_and_never_a_relocalisation(shift_s, kind, text):
    g = gate()
    assert all(r.accepted for r in run(g, range(10)))
    burst = run(g, range(10, 35), shift_ns=int(shift_s * S))  # 0.5 s of shifted stamps
    assert not any(r.accepted for r in burst)
    for r in burst:
        v = r.violations[0]
        assert v.field == "odometry.header.stamp" and text in v.bound, r.reason
        assert abs(v.value) == pytest.approx(abs(shift_s), abs=0.05)
    assert g.clock.faults.get(kind, 0) == len(burst) and g.reset_count == 0
    after = run(g, range(35, 60))
    assert all(r.accepted and not r.reset for r in after), [r.reason for r in after if not r.accepted]
    assert g.reset_count == 0


def test_a_single_sample_from_the_future_is_rejected_and_the_stream_goes_on():
    g = gate()
    run(g, range(10))
    assert not g.offer(*sample(10, shift_ns=10 * S)).accepted
    rest = run(g, range(11, 30))
    assert all(r.accepted and not r.reset for r in rest)


def test_backward_stamps_out_of_order_and_backward_jump():
    g = gate()
    run(g, range(10))
    last, now = sample(9)
    late = Motion(last.x, 0.0, 0.0, 10.0, 0.0, last.stamp_ns - 10 * MS)  # a reordered sample
    r = g.offer(late, now + 5 * MS)
    assert not r.accepted and "out of order" in r.reason
    back = Motion(last.x, 0.0, 0.0, 10.0, 0.0, last.stamp_ns - 300 * MS)  # within max_age: a jump back
    r = g.offer(back, now + 5 * MS)
    assert not r.accepted and "backward clock jump" in r.reason
    assert r.violations[0].value == pytest.approx(-0.3)


def test_simulated_time_allows_its_own_future_tolerance():
    ahead = int(0.3 * S)  # /clock trailing the simulator by 0.3 s under load
    assert not gate(sim=False).offer(*sample(0, shift_ns=ahead)).accepted
    assert gate(sim=True).offer(*sample(0, shift_ns=ahead)).accepted


def test_without_a_node_clock_only_the_order_is_judged():
    c = StampClock("x.stamp", ClockLimits.from_params(CLOCK, use_sim_time=True))
    assert c.check(5 * S, 0).accepted  # simulated time before the first /clock
    c.accept(5 * S)
    assert c.check(5 * S, 0).kind == "out_of_order"
    assert c.check(0, 0).kind == "unset"


def test_only_the_node_clock_going_back_resets_the_history():
    c = StampClock("x.stamp", ClockLimits.from_params(CLOCK, use_sim_time=True))
    assert c.check(100 * S, 100 * S).accepted
    c.accept(100 * S)
    assert c.check(90 * S, 100 * S).kind == "stale"  # the sender went back, the node did not
    verdict = c.check(10 * S, 10 * S)  # the node's clock went back with it (a replay looping)
    assert verdict.accepted and verdict.reset and c.resets == 1


def test_trajectory_stamps_may_repeat_but_not_come_from_the_future():
    limits = ClockLimits.from_params(CLOCK, False, monotonic=False, age=False)
    c = StampClock("trajectory.header.stamp", limits)
    assert c.check(100 * S, 100 * S).accepted
    c.accept(100 * S)
    assert c.check(100 * S, 101 * S).accepted  # a fallback keeps its predecessor's stamp
    assert c.check(90 * S, 101 * S).accepted  # and may be old (its age is judged by reception)
    assert c.check(110 * S, 101 * S).kind == "future"


def test_a_relocalisation_on_time_is_still_confirmed():
    g = gate(confirm=3)
    run(g, range(10))
    far = [g.offer(*sample(k, x0=5000.0)) for k in range(10, 13)]
    assert [r.accepted for r in far] == [False, False, True] and far[-1].reset
    assert "relocalisation: pose jump" in g.last_reset and "3 consecutive samples" in g.last_reset
    # the same jump with late stamps never confirms
    g2 = gate(confirm=3)
    run(g2, range(10))
    late = [g2.offer(*sample(k, x0=5000.0, shift_ns=-2 * S)) for k in range(10, 20)]
    assert not any(r.accepted for r in late) and g2.reset_count == 0


def test_rate_gate_reads_one_sample_per_period_of_stamps():
    from rad2_core.supervision import RateGate

    gate = RateGate(200.0)  # one per 5 ms of stamps
    stamps = [100 * S + k * int(1.2 * MS) for k in range(830)]  # 830 samples/s for 1 s
    admitted = [t for t in stamps if gate.admit(t, t)]
    assert 150 <= len(admitted) <= 201 and gate.dropped == len(stamps) - len(admitted)
    assert max(b - a for a, b in zip(admitted, admitted[1:])) <= 5 * MS + int(1.2 * MS)
    assert gate.rate_hz(stamps[-1]) == pytest.approx(832, abs=3) and gate.flooding(stamps[-1])
    # a 50 Hz stream that a stalled reader takes in one burst: every sample is admitted (by stamp)
    calm = RateGate(200.0)
    burst = [200 * S + k * 20 * MS for k in range(10)]
    assert all(calm.admit(t, 200 * S + 200 * MS) for t in burst) and not calm.flooding(200 * S + 200 * MS)
    # a stamp behind the last admitted one is left to the clock model, which names it
    assert calm.admit(burst[0], 200 * S + 201 * MS)



def test_rate_gate_sees_a_flood_through_a_polled_reader():
    """A reader that polls its history every 0.1 s and finds only the newest 20 samples of an 830 Hz
    flood (the rest overwritten in the middleware) still reports the flood, by the stamps' spacing;
    a 50 Hz stream read the same way is no flood."""
    from rad2_core.supervision import RateGate

    gate, calm = RateGate(200.0), RateGate(200.0)
    for poll in range(1, 11):
        now = 100 * S + poll * 100 * MS
        for k in range(20):
            gate.admit(now - (19 - k) * int(1.2 * MS), now)
        for k in range(5):
            calm.admit(now - (4 - k) * 20 * MS, now)
    assert gate.rate_hz(now) == pytest.approx(833, abs=5) and gate.flooding(now)
    assert calm.rate_hz(now) == pytest.approx(50, abs=1) and not calm.flooding(now)


def test_header_stamp_is_read_from_the_serialized_bytes():
    from rad2_ros import conversions as rc
    from rad2_ros.nodes.common import cdr_header_stamp_ns
    from rclpy.serialization import serialize_message

    stamp = 1_796_290_000_123_456_789
    data = serialize_message(rc.odometry_to_msg(Motion(1.0, 2.0, 0.1, 10.0, 0.0, stamp)))
    assert cdr_header_stamp_ns(data) == stamp and cdr_header_stamp_ns(b"\x00") == 0
