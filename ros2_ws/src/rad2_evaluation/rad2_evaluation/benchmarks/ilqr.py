"""Benchmark of the batched iLQR tracker against CasADi + IPOPT on the same tracking problems
(rad2 bench ilqr is the CLI; see its --help for what is reported).

Both solvers get the same model (the midpoint bicycle step of rad2_core.bicycle), the same
Eq. 10 cost, horizon, input box and speed/steering bounds and the same initial guess. CasADi and
matplotlib are imported where used. No ROS.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from rad2_control import TrackingController, shift_controls
from rad2_core.bicycle import rollout


def make_plans(n: int, rng: np.random.Generator, plan_dt: float, points: int):
    """n plans [n, T, 2] (ego frame) and initial states [n, 5] (ego frame, near the origin)."""
    t = plan_dt * np.arange(1, points + 1)
    plans, states, kinds = [], [], []
    for i in range(n):
        kind = ("straight", "curve", "stop_and_go", "lane_change")[i % 4]
        v = rng.uniform(4.0, 15.0)
        if kind == "straight":
            p = np.stack([v * t, np.zeros_like(t)], -1)
        elif kind == "curve":
            radius = rng.uniform(20.0, 60.0) * rng.choice([-1.0, 1.0])
            ang = v * t / radius
            p = np.stack([radius * np.sin(ang), radius * (1.0 - np.cos(ang))], -1)
        elif kind == "stop_and_go":
            v = rng.uniform(2.0, 6.0)
            speed = np.where(t < 1.5, v * (1.0 - t / 1.5), np.where(t < 2.5, 0.0, 2.0 * (t - 2.5)))
            p = np.stack([np.cumsum(speed * plan_dt), np.zeros_like(t)], -1)
        else:
            shift = 3.5 * rng.choice([-1.0, 1.0])
            s = np.clip(t / 3.0, 0.0, 1.0)
            p = np.stack([v * t, shift * (10 * s**3 - 15 * s**4 + 6 * s**5)], -1)
        x0 = np.array(
            [0.0, rng.normal(0.0, 0.3), rng.normal(0.0, 0.03), max(0.0, v + rng.normal(0.0, 0.5)), 0.0]
        )
        plans.append(p)
        states.append(x0)
        kinds.append(kind)
    return np.stack(plans), np.stack(states), kinds


def casadi_step(veh, dt: float):
    """The midpoint bicycle step of rad2_core.bicycle as a CasADi expression builder."""
    import casadi as ca

    def kappa_beta(delta):
        beta = ca.atan(veh.rho * ca.tan(delta))
        return ca.tan(delta) * ca.cos(beta) / veh.wheelbase, beta

    def step(x, u):
        half = 0.5 * dt
        vm = x[3] + half * u[0]
        dm = x[4] + half * u[1]
        k0, _ = kappa_beta(x[4])
        km, bm = kappa_beta(dm)
        th = x[2] + half * x[3] * k0 + bm
        return ca.vertcat(
            x[0] + dt * vm * ca.cos(th),
            x[1] + dt * vm * ca.sin(th),
            x[2] + dt * vm * km,
            x[3] + dt * u[0],
            x[4] + dt * u[1],
        )

    return step


def casadi_solver(tc: TrackingController):
    """An IPOPT NLP (multiple shooting) with the tracker's model, cost and bounds; x0, ref as parameters.
    Returns ``solve(x0, ref_states, u_guess) -> (final cost, ms, success)``."""
    import casadi as ca

    veh, dt, h = tc.vehicle, tc.dt, tc.horizon
    q = tc.weights.q
    r = tc.weights.r
    qt = q * tc.weights.terminal_scale
    step = casadi_step(veh, dt)
    X = ca.SX.sym("X", 5, h + 1)
    U = ca.SX.sym("U", 2, h)
    P = ca.SX.sym("P", 5 + 5 * h)
    x0 = P[:5]
    ref = ca.reshape(P[5:], 5, h)
    cost = 0
    g = [X[:, 0] - x0]
    for k in range(h):
        w = qt if k == h - 1 else q
        e = X[:, k + 1] - ref[:, k]
        cost += ca.dot(ca.DM(w) * e, e) + ca.dot(ca.DM(r) * U[:, k], U[:, k])
        g.append(X[:, k + 1] - step(X[:, k], U[:, k]))
    nlp = {"x": ca.vertcat(ca.vec(X), ca.vec(U)), "p": P, "f": cost, "g": ca.vertcat(*g)}
    opts = {
        "ipopt.print_level": 0,
        "print_time": 0,
        "ipopt.tol": 1e-9,
        "ipopt.sb": "yes",
        "ipopt.max_iter": 500,
    }
    solver = ca.nlpsol("tracker", "ipopt", nlp, opts)
    return _ipopt_solve(solver, veh, dt, h)


def _ipopt_solve(solver, veh, dt: float, h: int):
    inf = np.inf
    xlb = np.tile([-inf, -inf, -inf, 0.0, -veh.max_steer], h + 1)
    xub = np.tile([inf, inf, inf, veh.max_speed, veh.max_steer], h + 1)
    ulo, uhi = veh.control_bounds()
    lbx = np.concatenate([xlb, np.tile(ulo, h)])
    ubx = np.concatenate([xub, np.tile(uhi, h)])
    ng = 5 * (h + 1)

    def solve(x0v, refv, u_guess):
        xs, _ = rollout(x0v, u_guess, veh, dt)
        guess = np.concatenate([xs.reshape(-1), u_guess.reshape(-1)])
        p = np.concatenate([x0v, refv.T.reshape(-1, order="F")])
        t0 = time.perf_counter()
        sol = solver(x0=guess, p=p, lbx=lbx, ubx=ubx, lbg=np.zeros(ng), ubg=np.zeros(ng))
        elapsed = (time.perf_counter() - t0) * 1e3
        ok = solver.stats()["success"]
        return float(sol["f"]), elapsed, ok

    return solve


@dataclass
class IlqrTimings:
    """Solve times (ms), final costs and iterations of the cold, warm-started and batched iLQR solves."""

    cold_ms: list[float] = field(default_factory=list)
    cold_cost: list[float] = field(default_factory=list)
    cold_iters: list[int] = field(default_factory=list)
    cold_converged: list[bool] = field(default_factory=list)
    warm_ms: list[float] = field(default_factory=list)
    warm_cost: list[float] = field(default_factory=list)
    warm_iters: list[int] = field(default_factory=list)
    #: per problem (state after the first step, reference states, warm start) for IPOPT's warm problem
    warm_problems: list[tuple] = field(default_factory=list)
    batch_ms: list[float] = field(default_factory=list)
    batch_cost: np.ndarray | None = None
    batch_iters: float = float("nan")
    batch_index: np.ndarray | None = None


def time_single(tc: TrackingController, plans, states, plan_dt: float, repeats: int, kernel: str,
                out: IlqrTimings) -> None:
    """Cold single solves, then warm-started ones from the state 0.1 s later (first input applied)."""
    origin = np.zeros(3)
    for i in range(len(plans)):
        ref = tc.reference(plans[i], plan_dt, origin)
        for _ in range(repeats):
            t0 = time.perf_counter()
            sol = tc.solve(states[i], ref, kernel=kernel)
            out.cold_ms.append((time.perf_counter() - t0) * 1e3)
        out.cold_cost.append(sol.report.final_cost[0])
        out.cold_iters.append(sol.report.iterations[0])
        out.cold_converged.append(sol.report.converged[0])
        x1 = sol.states[0, 1]
        ref1 = tc.reference(plans[i], plan_dt, origin, age=tc.dt)
        ws = shift_controls(sol.controls, 1)
        for _ in range(repeats):
            t0 = time.perf_counter()
            sol1 = tc.solve(x1, ref1, warm_start=ws, kernel=kernel)
            out.warm_ms.append((time.perf_counter() - t0) * 1e3)
        out.warm_cost.append(sol1.report.final_cost[0])
        out.warm_iters.append(sol1.report.iterations[0])
        out.warm_problems.append((x1, ref1.states[0], ws[0]))


def time_batch(tc: TrackingController, plans, states, plan_dt: float, batch: int, repeats: int, kernel: str,
               out: IlqrTimings) -> None:
    """``batch`` problems (the plans repeated) in one call, ``repeats`` times."""
    idx = np.arange(batch) % len(plans)
    ref_b = tc.reference(plans[idx], plan_dt, np.zeros((batch, 3)))
    for _ in range(repeats):
        t0 = time.perf_counter()
        sol_b = tc.solve(states[idx], ref_b, kernel=kernel)
        out.batch_ms.append((time.perf_counter() - t0) * 1e3)
    out.batch_cost = sol_b.report.final_cost
    out.batch_iters = float(sol_b.report.iterations.mean())
    out.batch_index = idx


def solve_ipopt(tc: TrackingController, plans, states, plan_dt: float, warm_problems) -> dict[str, list]:
    """IPOPT on every cold problem and on its warm (one step later) counterpart."""
    solve_ip = casadi_solver(tc)
    res: dict[str, list] = {"ms": [], "cost": [], "warm_cost": [], "ok": []}
    for i in range(len(plans)):
        ref = tc.reference(plans[i], plan_dt, np.zeros(3))
        guess = tc.initial_guess(states[i][None], ref.states)[0]
        f, ms, ok = solve_ip(states[i], ref.states[0], guess)
        x1, r1, ws = warm_problems[i]
        f1, _, ok1 = solve_ip(x1, r1, ws)
        res["ms"].append(ms)
        res["cost"].append(f)
        res["warm_cost"].append(f1)
        res["ok"].append(ok and ok1)
    return res


def cost_gaps(t: IlqrTimings, ipopt: dict[str, list]) -> dict[str, np.ndarray]:
    """iLQR final cost / IPOPT final cost - 1, for the cold, warm and batched solves."""
    ip_cost = np.asarray(ipopt["cost"])
    return {
        "cold": np.asarray(t.cold_cost) / ip_cost - 1.0,
        "warm": np.asarray(t.warm_cost) / np.asarray(ipopt["warm_cost"]) - 1.0,
        "batch": t.batch_cost / ip_cost[t.batch_index] - 1.0,
    }


def print_cost_gaps(gaps: dict[str, np.ndarray], ipopt_ok: list[bool], kinds: list[str]) -> None:
    print(f"IPOPT successes: {int(np.sum(ipopt_ok))}/{len(ipopt_ok)}")
    for name, rr in gaps.items():
        print(
            f"final cost vs IPOPT ({name}): median {100 * np.median(rr):+.3f}%  "
            f"max {100 * np.max(rr):+.3f}%  within 1%: {int(np.sum(rr <= 0.01))}/{rr.size}"
        )
    for kind in sorted(set(kinds)):
        sel = np.array([k == kind for k in kinds])
        print(f"  {kind:12s} cold cost gap max {100 * np.max(gaps['cold'][sel]):+.3f}%")


def plot_benchmark(rows, gaps: dict[str, np.ndarray] | None, tc: TrackingController, png: Path) -> None:
    """Solve-time box plots and, with IPOPT, the histogram of the final-cost gaps."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    labels = [r[0] for r in rows if len(r[1]) > 1]
    data = [r[1] for r in rows if len(r[1]) > 1]
    axes[0].boxplot(data, showfliers=True)
    axes[0].set_xticks(range(1, len(labels) + 1), labels, rotation=20, ha="right", fontsize=8)
    axes[0].set_yscale("log")
    axes[0].set_ylabel("solve time [ms]")
    axes[0].set_title(f"solve time, H={tc.horizon}, dt={tc.dt}s")
    if gaps is not None:
        axes[1].hist(100 * gaps["cold"], bins=20, alpha=0.7, label="cold")
        axes[1].hist(100 * gaps["warm"], bins=20, alpha=0.7, label="warm")
        axes[1].axvline(1.0, color="k", ls="--", lw=1)
        axes[1].set_xlabel("iLQR final cost / IPOPT final cost - 1 [%]")
        axes[1].set_ylabel("problems")
        axes[1].legend()
        axes[1].set_title("final cost gap to IPOPT")
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=120)


def print_timings(rows, kinds: list[str], tc: TrackingController, kernel: str, load_start, load_end,
                  converged: list[bool]) -> None:
    print(f"problems: {len(converged)} ({', '.join(sorted(set(kinds)))}), horizon {tc.horizon} x {tc.dt} s")
    print(
        f"iLQR kernel: {kernel}; load average (1/5/15 min) during the iLQR timings: start "
        + "/".join(f"{v:.2f}" for v in load_start)
        + ", end "
        + "/".join(f"{v:.2f}" for v in load_end)
        + f" ({os.cpu_count()} CPUs)"
    )
    print(f"{'solver':34s} {'median ms':>10s} {'p99 ms':>10s} {'mean iters':>10s}")
    for name, times, its in rows:
        print(f"{name:34s} {np.median(times):10.3f} {np.percentile(np.asarray(times), 99):10.3f} {its:10.2f}")
    print(f"iLQR converged (cold): {int(np.sum(converged))}/{len(converged)}")


def run_benchmark(params: dict[str, dict], problems: int = 40, repeats: int = 5, batch: int = 64,
                  batch_repeats: int = 20, seed: int = 0, png: Path | None = None, ipopt: bool = True,
                  json_path: Path | None = None, kernel: str = "auto") -> dict[str, Any]:
    """The whole benchmark of rad2 bench ilqr: prints the table (and cost gaps), writes the figure
    and the optional JSON; returns the JSON record. ``params``: controller, vehicle and planner of
    ``load_all()``."""
    tc = TrackingController(params["controller"], params["vehicle"])
    plan_cfg = params["planner"]["planner"]
    plan_dt, points = float(plan_cfg["plan_dt"]), int(plan_cfg["plan_points"])
    plans, states, kinds = make_plans(problems, np.random.default_rng(seed), plan_dt, points)
    load_start = os.getloadavg()
    t = IlqrTimings()
    time_single(tc, plans, states, plan_dt, repeats, kernel, t)
    time_batch(tc, plans, states, plan_dt, batch, batch_repeats, kernel, t)
    load_end = os.getloadavg()
    rows = [
        ("iLQR single, cold", t.cold_ms, np.mean(t.cold_iters)),
        ("iLQR single, warm", t.warm_ms, np.mean(t.warm_iters)),
        (f"iLQR batch of {batch}", t.batch_ms, t.batch_iters),
    ]
    ip = solve_ipopt(tc, plans, states, plan_dt, t.warm_problems) if ipopt else None
    if ip is not None:
        rows.append(("CasADi + IPOPT single", ip["ms"], float("nan")))
        rows.append((f"CasADi + IPOPT {batch} sequential", [np.mean(ip["ms"]) * batch], float("nan")))
    print_timings(rows, kinds, tc, kernel, load_start, load_end, t.cold_converged)
    record = {
        "load_before": load_start[0], "load_after": load_end[0], "kernel": kernel,
        "rows": [{"name": name, "median_ms": float(np.median(ms)), "p99_ms": float(np.percentile(ms, 99)),
                  "iterations": float(its)} for name, ms, its in rows]}
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(record, indent=1))
    gaps = cost_gaps(t, ip) if ip is not None else None
    if gaps is not None:
        print_cost_gaps(gaps, ip["ok"], kinds)
    if png is not None:
        plot_benchmark(rows, gaps, tc, png)
        print(f"figure: {png}")
    return record
