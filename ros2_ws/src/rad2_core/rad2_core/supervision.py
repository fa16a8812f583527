"""Supervision of the online stack without ROS: input gates, watchdogs and fault bookkeeping.

The nodes (perception, planner, controller, supervisor) keep their ROS I/O thin and call these:

- :class:`StampClock`: the one clock model of every stamped input (odometry, object lists, BEV and
  scene tokens, trajectories). A stamp is judged against the receiving node's clock and against the
  previous accepted stamp: unset (<= 0), further ahead of the node clock than ``max_future_s`` (a
  forward jump: +10 s, +1 h), further behind it than ``max_age_s`` (stale, or a backward jump of the
  sender's clock), or not after the previous accepted stamp (out of order; beyond ``max_backward_s``
  a backward clock jump) are each a named fault (field, offset, tolerance) and the sample is
  rejected like any impossible value. Nothing about time ever resets the history except the explicit
  signal of the node's own clock jumping back (the simulator restarting its time).
- :class:`OdometryGate`: odometry through the stamp clock, then
  :func:`rad2_core.validators.check_odometry` alone and against the last accepted sample. Impossible
  values (speed 1e6 m/s, yaw rate 1e9, stamp 0) are always rejected; a pose jump or a speed change
  that the stamp gap cannot explain is rejected too, unless ``confirm_samples`` consecutive samples,
  every one on time by the node's clock, agree with each other at the new place: a relocalisation
  (or the simulator starting its next clip), accepted as a reset. That is the only rule that resets
  the gate; a sample the clock rejects never counts towards it.
- :class:`RateGate`: at most one sample per period of a stream's stamps (a flood is dropped unread).
- :class:`HeartbeatMonitor`: the last heartbeat per node and which ones are overdue.
- :func:`explain_starvation`: why a planner that pairs BEV features with scene tokens by stamp has
  had nothing to plan on (what is missing, how stale, why unpaired).
- :class:`FaultLatch`: faults raised between two cycles stay visible in the next cycle's report even
  when good input cleared them in between (so every rejection reaches the diagnostics).
- :func:`describe_violations`: one line naming field, value and bound of each violation.

Times are integer nanoseconds on the caller's clock (the node clock: system or simulated).
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rad2_core.validators import Violation, check_odometry


def describe_violations(violations: Sequence[Violation], limit: int = 4) -> str:
    """``"speed = 1e+06 violates [-2, 60] m/s; ..."`` (at most ``limit`` of them, then a count)."""
    text = "; ".join(str(v) for v in violations[:limit])
    if len(violations) > limit:
        text += f"; and {len(violations) - limit} more"
    return text


# --------------------------------------------------------------------------------------------------
# time: one clock model for every stamped input
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ClockLimits:
    """Tolerances of one stamped input against the receiving node's clock (seconds).

    ``max_age_s``: a stamp further behind the node clock is stale (None: not judged, for inputs whose
    stamp may legitimately be old, such as a fallback plan that keeps its predecessor's stamp).
    ``max_future_s``: a stamp further ahead is from the future. ``max_backward_s``: a stamp not after
    the previous accepted one is out of order; this far behind it, a backward clock jump.
    ``monotonic``: whether stamps must increase at all (False for trajectories, whose fallbacks reuse
    a stamp)."""

    max_age_s: float | None
    max_future_s: float
    max_backward_s: float
    monotonic: bool = True

    @classmethod
    def from_params(cls, clock: dict[str, Any], use_sim_time: bool, monotonic: bool = True,
                    age: bool = True) -> ClockLimits:
        """From the ``validators.clock`` block (params/validators.yaml): ``max_future_sim_s`` on
        simulated time (a node's /clock trails its publisher's by the delivery, more under load)."""
        future = clock["max_future_sim_s"] if use_sim_time else clock["max_future_s"]
        return cls(float(clock["max_age_s"]) if age else None, float(future), float(clock["max_backward_s"]),
                   monotonic)


@dataclass(frozen=True)
class ClockVerdict:
    """What the clock model says of one stamp: accepted, or the fault (kind and the violation naming
    field, offset and tolerance); ``reset`` when the node's own clock jumped back before it (the
    explicit signal that restarts the history)."""

    accepted: bool
    violation: Violation | None = None
    kind: str = ""  # unset | future | stale | out_of_order | backward_jump
    reset: bool = False

    @property
    def reason(self) -> str:
        return "" if self.violation is None else str(self.violation)


class StampClock:
    """Monotonic stamps within a tolerance of the node's clock, for one input (``field``: the name
    reports use, e.g. ``odometry.header.stamp``).

    ``check`` judges a stamp without taking it; ``accept`` records one that the caller accepted (after
    its own checks). A node clock that reads 0 (simulated time before the first /clock) cannot judge
    age or future: only order is checked then. When the node clock runs backwards (by more than
    ``max_backward_s``: the simulator restarting time, a replayed bag looping) the previous stamp no
    longer applies and the next stamp starts a new history (``reset``)."""

    def __init__(self, field: str, limits: ClockLimits):
        self.field = str(field)
        self.limits = limits
        self.last_ns: int | None = None  # last accepted stamp
        self._last_now_ns: int | None = None
        self.faults: dict[str, int] = {}  # kind -> count
        self.resets = 0

    def _fault(self, kind: str, value: float, bound: str) -> ClockVerdict:
        self.faults[kind] = self.faults.get(kind, 0) + 1
        return ClockVerdict(False, Violation(self.field, value, bound), kind)

    def check(self, stamp_ns: int, now_ns: int) -> ClockVerdict:
        lim = self.limits
        reset = False
        if now_ns > 0:
            if self._last_now_ns is not None and now_ns < self._last_now_ns - lim.max_backward_s * 1e9:
                # the node's own clock went back: the explicit signal that time restarted
                self.last_ns = None
                self.resets += 1
                reset = True
            self._last_now_ns = now_ns
        stamp_ns = int(stamp_ns)
        if stamp_ns <= 0:
            return self._fault("unset", float(stamp_ns), "> 0 (an unset stamp)")
        if now_ns > 0:
            ahead = (stamp_ns - now_ns) / 1e9
            if ahead > lim.max_future_s:
                return self._fault("future", ahead, f"<= {lim.max_future_s:g} s ahead of the node clock "
                                   f"(a forward clock jump)")
            if lim.max_age_s is not None and -ahead > lim.max_age_s:
                return self._fault("stale", -ahead, f"<= {lim.max_age_s:g} s behind the node clock "
                                   f"(stale, or a backward clock jump)")
        if lim.monotonic and self.last_ns is not None and stamp_ns <= self.last_ns:
            back = (self.last_ns - stamp_ns) / 1e9
            if back > lim.max_backward_s:
                return self._fault("backward_jump", -back, f">= -{lim.max_backward_s:g} s from the previous "
                                   f"stamp (a backward clock jump)")
            return self._fault("out_of_order", -back, "> 0 s after the previous stamp (out of order)")
        return ClockVerdict(True, reset=reset)

    def accept(self, stamp_ns: int) -> None:
        stamp_ns = int(stamp_ns)
        if self.last_ns is None or stamp_ns > self.last_ns:
            self.last_ns = stamp_ns


class RateGate:
    """Admit at most one sample per ``1 / max_rate_hz`` of stamp time from a stream: a flood (a sender
    gone wild, 830 odometry messages/s) costs the receiver a stamp comparison per surplus sample, not
    a validation and a state update each, and the sample used is never older than one period behind
    the newest. Admission is by stamp, not by arrival, so samples that a stalled receiver takes in one
    burst are all admitted; a stamp behind the last admitted one is admitted (the clock model rejects
    it by name).

    ``rate_hz`` is the stream's rate for reports: the larger of the arrivals over the last second and
    the rate the stamps of consecutive samples seen in that second show (the median spacing). The
    second is what a polled reader sees of a flood: it reads only the newest samples of its reader's
    history, 20 every 0.1 s, spaced 1.2 ms apart by their stamps."""

    def __init__(self, max_rate_hz: float):
        if not max_rate_hz > 0:
            raise ValueError(f"max_rate_hz must be > 0, got {max_rate_hz}")
        self.max_rate_hz = float(max_rate_hz)
        self.min_period_ns = int(round(1e9 / float(max_rate_hz)))
        self.last_ns: int | None = None
        self.dropped = 0
        self._arrivals: deque[int] = deque()
        self._last_seen_ns: int | None = None  # stamp of the last sample offered, admitted or not
        self._spacings: deque[tuple[int, int]] = deque()  # (arrival, stamp gap to the previous sample)

    def admit(self, stamp_ns: int, arrived_ns: int) -> bool:
        arrived_ns, stamp_ns = int(arrived_ns), int(stamp_ns)
        self._arrivals.append(arrived_ns)
        while self._arrivals and arrived_ns - self._arrivals[0] > 1_000_000_000:
            self._arrivals.popleft()
        if self._last_seen_ns is not None and stamp_ns > self._last_seen_ns:
            self._spacings.append((arrived_ns, stamp_ns - self._last_seen_ns))
        while self._spacings and arrived_ns - self._spacings[0][0] > 1_000_000_000:
            self._spacings.popleft()
        self._last_seen_ns = stamp_ns
        if self.last_ns is not None and 0 <= stamp_ns - self.last_ns < self.min_period_ns:
            self.dropped += 1
            return False
        self.last_ns = stamp_ns
        return True

    def rate_hz(self, now_ns: int) -> float:
        """Messages per second over the last second before ``now_ns``: by arrivals or by the stamps'
        spacing, whichever is higher."""
        arrivals = float(sum(1 for t in self._arrivals if now_ns - t <= 1_000_000_000))
        gaps = [gap for t, gap in self._spacings if now_ns - t <= 1_000_000_000]
        by_stamps = 1e9 / float(statistics.median(gaps)) if len(gaps) >= 3 else 0.0
        return max(arrivals, by_stamps)

    def flooding(self, now_ns: int) -> bool:
        return self.rate_hz(now_ns) > self.max_rate_hz


# --------------------------------------------------------------------------------------------------
# odometry gate
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GateResult:
    """What the gate decided about one sample: accepted (possibly as a reset) or the violations."""

    accepted: bool
    violations: tuple[Violation, ...] = ()
    reset: bool = False  # accepted as a relocalisation: the previous history no longer applies

    @property
    def reason(self) -> str:
        return describe_violations(self.violations)


class OdometryGate:
    """Accept plausible odometry on time; hold back pose jumps until ``confirm_samples`` samples
    confirm them.

    ``limits`` is the ``validators`` block of params/validators.yaml; ``confirm_samples`` (>= 1) how
    many consecutive mutually consistent samples make a jump a relocalisation (1: a jump is accepted
    at once as a reset, which also disables jump rejection). ``clock``: the stamp clock of the input
    (None: ``validators.clock`` on the system clock). ``offer`` takes the node clock's ``now_ns``:
    every stamp is judged against it before the motion, so no clock fault can pass for motion, and a
    rejected sample never joins a relocalisation's confirmation. Stamps that go back are rejected
    however many agree (a replayed log that loops restarts the node's clock, which resets the
    clock model, and so the gate).
    """

    def __init__(self, limits: dict[str, Any], confirm_samples: int, clock: StampClock | None = None):
        if confirm_samples < 1:
            raise ValueError(f"confirm_samples must be >= 1, got {confirm_samples}")
        self.limits = limits
        self.confirm_samples = int(confirm_samples)
        self.clock = clock or StampClock("odometry.header.stamp",
                                         ClockLimits.from_params(limits["clock"], use_sim_time=False))
        self.last: Any | None = None  # last accepted motion
        self._chain: list[Any] = []  # consistent samples at a new place, waiting for confirmation
        self.accepted_count = 0
        self.rejected_count = 0
        self.reset_count = 0
        self.last_reset = ""  # why the last relocalisation was accepted

    def offer(self, motion: Any, now_ns: int | None = None) -> GateResult:
        """Judge one sample; ``now_ns`` is the node clock at reception (None: no clock to judge the
        stamp against, as offline over a log: then only the order of stamps is checked)."""
        alone = check_odometry(motion, self.limits)
        if alone:
            self.rejected_count += 1
            return GateResult(False, tuple(alone))
        verdict = self.clock.check(int(motion.stamp_ns), 0 if now_ns is None else int(now_ns))
        if verdict.reset:  # the node's clock restarted: the previous odometry belongs to another time
            self.last = None
            self._chain.clear()
        if not verdict.accepted:
            self.rejected_count += 1
            return GateResult(False, (verdict.violation,))
        relative = [] if self.last is None else check_odometry(motion, self.limits, previous=self.last)
        if not relative:
            self._chain.clear()
            return self._accept(motion, reset=False)
        # inconsistent with the last accepted sample: a fault, or the first samples of a relocalisation
        if self._chain and not check_odometry(motion, self.limits, previous=self._chain[-1]):
            self._chain.append(motion)
        else:
            self._chain = [motion]
        if len(self._chain) >= self.confirm_samples:
            first = self._chain[0]
            jump = math.hypot(motion.x - self.last.x, motion.y - self.last.y)
            self.last_reset = (f"relocalisation: pose jump of {jump:.1f} m "
                               f"confirmed by {len(self._chain)} consecutive samples on time "
                               f"({(int(motion.stamp_ns) - int(first.stamp_ns)) / 1e9:.2f} s)")
            self._chain.clear()
            self.reset_count += 1
            return self._accept(motion, reset=True)
        self.rejected_count += 1
        return GateResult(False, tuple(relative))

    @property
    def pending(self) -> bool:
        """Samples at a new place await confirmation (the ego's state is uncertain meanwhile)."""
        return bool(self._chain)

    def _accept(self, motion: Any, reset: bool) -> GateResult:
        self.last = motion
        self.clock.accept(int(motion.stamp_ns))
        self.accepted_count += 1
        return GateResult(True, (), reset)


# --------------------------------------------------------------------------------------------------
# heartbeats
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class HeartbeatStatus:
    name: str
    seen: bool
    age_s: float  # since the last heartbeat (inf when never seen)
    timeout_s: float

    @property
    def lost(self) -> bool:
        return self.seen and self.age_s > self.timeout_s

    @property
    def message(self) -> str:
        if not self.seen:
            return f"no heartbeat from {self.name} yet"
        if self.lost:
            return (f"{self.name} heartbeat lost: {self.age_s:.3f} s since the last one "
                    f"(timeout {self.timeout_s:g} s)")
        return f"{self.name} alive: last heartbeat {self.age_s * 1e3:.0f} ms ago"


class HeartbeatMonitor:
    """Last heartbeat (receive time) of each watched node; ``timeouts`` maps node name -> seconds."""

    def __init__(self, timeouts: dict[str, float]):
        self.timeouts = {str(k): float(v) for k, v in timeouts.items()}
        self.last_ns: dict[str, int] = {}

    def beat(self, name: str, received_ns: int) -> None:
        if name in self.timeouts:
            self.last_ns[name] = int(received_ns)

    def refresh(self, name: str, received_ns: int) -> None:
        """Other evidence that ``name`` is alive (e.g. its output arrived); counts only once its own
        heartbeat was seen, so a publisher without heartbeats is never held to the heartbeat timeout."""
        if name in self.last_ns:
            self.last_ns[name] = max(self.last_ns[name], int(received_ns))

    def rebase(self, now_ns: int) -> None:
        """After a jump of the clock (simulated time starting or restarting): every node seen so far
        counts as having beaten at ``now_ns``, so the jump itself is not a loss."""
        for name in self.last_ns:
            self.last_ns[name] = int(now_ns)

    def status(self, now_ns: int) -> list[HeartbeatStatus]:
        out = []
        for name, timeout in self.timeouts.items():
            last = self.last_ns.get(name)
            age = float("inf") if last is None else max(0, now_ns - last) / 1e9
            out.append(HeartbeatStatus(name, last is not None, age, timeout))
        return out

    def lost(self, now_ns: int) -> list[HeartbeatStatus]:
        """Nodes that were seen and whose heartbeat is now overdue."""
        return [s for s in self.status(now_ns) if s.lost]


# --------------------------------------------------------------------------------------------------
# planner input starvation
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Seen:
    """The last message of one input: its header stamp and when it was received (node clock)."""

    stamp_ns: int
    received_ns: int


def explain_starvation(now_ns: int, bev: Seen | None, tokens: Seen | None, sync_tolerance_s: float,
                       last_cycle_ns: int | None) -> str:
    """Why no planning cycle ran since ``last_cycle_ns``: which input is missing and for how long, or
    why the two did not pair up (their stamps differ by more than the sync tolerance)."""
    since = "" if last_cycle_ns is None else f" for {(now_ns - last_cycle_ns) / 1e9:.2f} s"
    parts = []
    for name, seen in (("BEV features", bev), ("scene tokens", tokens)):
        if seen is None:
            parts.append(f"no {name} received")
        else:
            parts.append(f"{name} last received {(now_ns - seen.received_ns) / 1e9:.2f} s ago "
                         f"(stamp {seen.stamp_ns / 1e9:.3f} s)")
    why = "; ".join(parts)
    if bev is not None and tokens is not None:
        gap = abs(bev.stamp_ns - tokens.stamp_ns) / 1e9
        age_b, age_t = now_ns - bev.received_ns, now_ns - tokens.received_ns
        if gap > sync_tolerance_s:
            newer = "BEV features" if bev.stamp_ns > tokens.stamp_ns else "scene tokens"
            why = (f"unpaired: BEV and token stamps {gap * 1e3:.0f} ms apart > sync tolerance "
                   f"{sync_tolerance_s * 1e3:.0f} ms (waiting for the partner of the {newer}); " + why)
        elif abs(age_b - age_t) > 0:
            missing = "BEV features" if age_b > age_t else "scene tokens"
            why = f"waiting for new {missing}; " + why
    return f"no planning input{since}: {why}"


# --------------------------------------------------------------------------------------------------
# fault bookkeeping
# --------------------------------------------------------------------------------------------------


@dataclass
class FaultLatch:
    """Active faults by key, plus faults raised since the last report (even if already cleared).

    ``reason()`` is what a cycle reports: every active fault and every fault raised since the previous
    ``reason()`` call, so a rejected input that good input replaced before the next cycle still shows
    in that cycle's diagnostics and still triggers its safe behaviour once.
    """

    active: dict[str, str] = field(default_factory=dict)
    _unreported: dict[str, str] = field(default_factory=dict)

    def raise_fault(self, key: str, text: str) -> None:
        self.active[key] = text
        self._unreported[key] = text

    def clear(self, key: str) -> None:
        self.active.pop(key, None)

    def clear_all(self, keys: Iterable[str]) -> None:
        for k in keys:
            self.clear(k)

    def reason(self) -> str:
        texts = dict(self._unreported)
        texts.update(self.active)
        self._unreported.clear()
        return "; ".join(texts.values())

    def __bool__(self) -> bool:
        return bool(self.active or self._unreported)
