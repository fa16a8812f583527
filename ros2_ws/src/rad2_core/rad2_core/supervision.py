"""Supervision of the online stack without ROS: input gates, watchdogs and fault bookkeeping.

The nodes (perception, planner, controller, supervisor) keep their ROS I/O thin and call these:

- :class:`OdometryGate`: odometry through :func:`rad2_core.validators.check_odometry`, alone and
  against the last accepted sample. Impossible values (speed 1e6 m/s, yaw rate 1e9, stamp 0) are
  always rejected; a jump or a speed change that the stamp gap cannot explain is rejected too,
  unless ``confirm_samples`` consecutive samples agree with each other at the new place — a real
  relocalisation (or the simulator starting its next clip), accepted as a reset.
- :class:`HeartbeatMonitor`: the last heartbeat per node and which ones are overdue.
- :func:`explain_starvation`: why a planner that pairs BEV features with scene tokens by stamp has
  had nothing to plan on (what is missing, how stale, why unpaired).
- :class:`FaultLatch`: faults raised between two cycles stay visible in the next cycle's report even
  when good input cleared them in between (so every rejection reaches the diagnostics).
- :func:`describe_violations`: one line naming field, value and bound of each violation.

Times are integer nanoseconds on the caller's clock (the node clock: system or simulated).
"""

from __future__ import annotations

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
    """Accept plausible odometry; hold back jumps until ``confirm_samples`` samples confirm them.

    ``limits`` is the ``validators`` block of params/validators.yaml; ``confirm_samples`` (>= 1) how
    many consecutive mutually consistent samples make a jump a relocalisation (1: a jump is accepted
    at once as a reset, which also disables jump rejection).
    """

    def __init__(self, limits: dict[str, Any], confirm_samples: int):
        if confirm_samples < 1:
            raise ValueError(f"confirm_samples must be >= 1, got {confirm_samples}")
        self.limits = limits
        self.confirm_samples = int(confirm_samples)
        self.last: Any | None = None  # last accepted motion
        self._chain: list[Any] = []  # consistent samples at a new place, waiting for confirmation
        self.accepted_count = 0
        self.rejected_count = 0
        self.reset_count = 0

    def offer(self, motion: Any) -> GateResult:
        alone = check_odometry(motion, self.limits)
        if alone:
            self.rejected_count += 1
            return GateResult(False, tuple(alone))
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
