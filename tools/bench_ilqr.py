#!/usr/bin/env python3
"""Benchmark the batched iLQR tracker against CasADi + IPOPT on the same tracking problems.

Both solvers get the same model (midpoint bicycle step of rad2_planner.control.bicycle), the same
Eq. 10 cost, horizon, input box and speed/steering bounds, and the same initial guess. Problems are
straight, curved, stop-and-go and lane-change plans (params/controller.yaml, params/vehicle.yaml)
with random initial offsets. Reported: solve time median / p99 (single problem cold, single problem
warm-started from the previous step's solution, batch of 64 in one call) and the final cost relative
to IPOPT's (IPOPT solved to tolerance 1e-9 on every problem).

Run single-core figures with ``taskset -c 0 .venv/bin/python tools/bench_ilqr.py``; the load average
is printed with them (timings on a busy machine are not comparable). ``--kernel`` forces the iLQR
kernel (default: the per-problem one for small batches, the batched numpy one otherwise).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np
from rad2_planner.control import TrackingController, shift_controls
from rad2_planner.control.bicycle import rollout

ROOT = Path(__file__).resolve().parents[1]



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


def casadi_solver(tc: TrackingController):
    """An IPOPT NLP (multiple shooting) with the tracker's model, cost and bounds; x0, ref as parameters."""
    import casadi as ca

    veh, dt, h = tc.vehicle, tc.dt, tc.horizon
    q = tc.weights.q
    r = tc.weights.r
    qt = q * tc.weights.terminal_scale

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


def pct(values, p):
    return float(np.percentile(np.asarray(values), p))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--problems", type=int, default=40, help="number of tracking problems (default 40)")
    ap.add_argument("--repeats", type=int, default=5, help="timing repeats per iLQR problem (default 5)")
    ap.add_argument("--batch", type=int, default=64, help="batch size of the batched timing (default 64)")
    ap.add_argument("--batch-repeats", type=int, default=20, help="timing repeats of the batch (default 20)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--png",
        type=Path,
        default=ROOT / "docs" / "figures" / "bench_ilqr.png",
        help="where to save the figure",
    )
    ap.add_argument("--no-ipopt", action="store_true", help="skip the CasADi/IPOPT side")
    ap.add_argument("--json", type=Path, default=None,
                    help="also write the timings as JSON (tools/bench_all.py)")
    ap.add_argument(
        "--kernel", choices=("auto", "numpy", "small"), default="auto", help="iLQR kernel (default auto)"
    )
    args = ap.parse_args(argv)
    if args.problems < 1 or args.batch < 1:
        ap.error(f"--problems and --batch must be >= 1 (got {args.problems}, {args.batch})")

    from rad2_planner.config import load_params

    tc = TrackingController()
    plan_cfg = load_params("planner")["planner"]
    plan_dt, points = float(plan_cfg["plan_dt"]), int(plan_cfg["plan_points"])
    rng = np.random.default_rng(args.seed)
    plans, states, kinds = make_plans(args.problems, rng, plan_dt, points)
    origin = np.zeros(3)
    load_start = os.getloadavg()
    kern = args.kernel

    # Cold single solves.
    cold_t, cold_cost, cold_it, cold_conv, warm_t, warm_cost, warm_it = [], [], [], [], [], [], []
    warm_problems = []
    for i in range(args.problems):
        ref = tc.reference(plans[i], plan_dt, origin)
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            sol = tc.solve(states[i], ref, kernel=kern)
            cold_t.append((time.perf_counter() - t0) * 1e3)
        cold_cost.append(sol.report.final_cost[0])
        cold_it.append(sol.report.iterations[0])
        cold_conv.append(sol.report.converged[0])
        # Warm start: apply the first input, re-plan from the next state 0.1 s later.
        x1 = sol.states[0, 1]
        ref1 = tc.reference(plans[i], plan_dt, origin, age=tc.dt)
        ws = shift_controls(sol.controls, 1)
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            sol1 = tc.solve(x1, ref1, warm_start=ws, kernel=kern)
            warm_t.append((time.perf_counter() - t0) * 1e3)
        warm_cost.append(sol1.report.final_cost[0])
        warm_it.append(sol1.report.iterations[0])
        warm_problems.append((x1, ref1.states[0], ws[0]))

    # Batch.
    idx = np.arange(args.batch) % args.problems
    ref_b = tc.reference(plans[idx], plan_dt, np.zeros((args.batch, 3)))
    batch_t = []
    for _ in range(args.batch_repeats):
        t0 = time.perf_counter()
        sol_b = tc.solve(states[idx], ref_b, kernel=kern)
        batch_t.append((time.perf_counter() - t0) * 1e3)
    batch_cost = sol_b.report.final_cost
    load_end = os.getloadavg()

    rows = [
        ("iLQR single, cold", cold_t, np.mean(cold_it)),
        ("iLQR single, warm", warm_t, np.mean(warm_it)),
        (f"iLQR batch of {args.batch}", batch_t, float(sol_b.report.iterations.mean())),
    ]
    ip_t, ip_cost, ip_warm_cost, ip_ok = [], [], [], []
    if not args.no_ipopt:
        solve_ip = casadi_solver(tc)
        for i in range(args.problems):
            ref = tc.reference(plans[i], plan_dt, origin)
            guess = tc.initial_guess(states[i][None], ref.states)[0]
            f, ms, ok = solve_ip(states[i], ref.states[0], guess)
            ip_t.append(ms)
            ip_cost.append(f)
            ip_ok.append(ok)
            x1, r1, ws = warm_problems[i]
            f1, _, ok1 = solve_ip(x1, r1, ws)
            ip_warm_cost.append(f1)
            ip_ok[-1] = ip_ok[-1] and ok1
        rows.append(("CasADi + IPOPT single", ip_t, float("nan")))
        rows.append((f"CasADi + IPOPT {args.batch} sequential", [np.mean(ip_t) * args.batch], float("nan")))

    print(f"problems: {args.problems} ({', '.join(sorted(set(kinds)))}), horizon {tc.horizon} x {tc.dt} s")
    print(
        f"iLQR kernel: {kern}; load average (1/5/15 min) during the iLQR timings: start "
        + "/".join(f"{v:.2f}" for v in load_start)
        + ", end "
        + "/".join(f"{v:.2f}" for v in load_end)
        + f" ({os.cpu_count()} CPUs)"
    )
    print(f"{'solver':34s} {'median ms':>10s} {'p99 ms':>10s} {'mean iters':>10s}")
    for name, times, its in rows:
        print(f"{name:34s} {np.median(times):10.3f} {pct(times, 99):10.3f} {its:10.2f}")
    print(f"iLQR converged (cold): {int(np.sum(cold_conv))}/{args.problems}")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "load_before": load_start[0], "load_after": load_end[0], "kernel": kern,
            "rows": [{"name": name, "median_ms": float(np.median(t)), "p99_ms": float(pct(t, 99)),
                      "iterations": float(its)} for name, t, its in rows]}, indent=1))
    if ip_cost:
        ip_cost = np.asarray(ip_cost)
        ratio_cold = np.asarray(cold_cost) / ip_cost - 1.0
        ratio_warm = np.asarray(warm_cost) / np.asarray(ip_warm_cost) - 1.0
        ratio_batch = batch_cost / ip_cost[idx] - 1.0
        print(f"IPOPT successes: {int(np.sum(ip_ok))}/{args.problems}")
        for name, rr in (("cold", ratio_cold), ("warm", ratio_warm), ("batch", ratio_batch)):
            print(
                f"final cost vs IPOPT ({name}): median {100 * np.median(rr):+.3f}%  "
                f"max {100 * np.max(rr):+.3f}%  within 1%: {int(np.sum(rr <= 0.01))}/{rr.size}"
            )
        for kind in sorted(set(kinds)):
            sel = np.array([k == kind for k in kinds])
            print(f"  {kind:12s} cold cost gap max {100 * np.max(ratio_cold[sel]):+.3f}%")

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
    if ip_cost is not None and len(ip_cost):
        axes[1].hist(100 * ratio_cold, bins=20, alpha=0.7, label="cold")
        axes[1].hist(100 * ratio_warm, bins=20, alpha=0.7, label="warm")
        axes[1].axvline(1.0, color="k", ls="--", lw=1)
        axes[1].set_xlabel("iLQR final cost / IPOPT final cost - 1 [%]")
        axes[1].set_ylabel("problems")
        axes[1].legend()
        axes[1].set_title("final cost gap to IPOPT")
    fig.tight_layout()
    args.png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.png, dpi=120)
    print(f"figure: {args.png}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
