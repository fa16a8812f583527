"""Imitation with correction: teach the generator to propose again given the proposals it had rejected.

CorrectionPlanner (§3.3, "self-correction in imitation learning") trains the planner to predict the
expert conditioned on a trace of its own unsafe proposals. Here, on RAD-2's diffusion generator:

1. **Mining.** On every sample of the imitation feature cache (``training/imitation.py``: logged and
   pose-perturbed observations), the pretrained generator draws M proposals and the collision critic
   judges them; the proposals with risk >= ``safety_layer.threshold`` are that sample's unsafe set
   (highest risk first, at most L = ``correction_trace_len``). The critic learned its labels from
   simulator rollouts; using it here makes the training trace what the planner rejects at run time.
2. **Model.** A copy of the pretrained generator plus a correction encoder
   (:mod:`rad2_planner.networks.correction`). The scene encoder stays frozen, so a planning cycle
   encodes its scene once and both the plain and the self-correcting denoiser read those tokens
   (``Rad2Policy`` checks the two encoders are equal).
3. **Loss.** The generator's x0 loss on the expert target (``imitation.diffusion_loss``), with a trace
   of ``l`` of the sample's unsafe proposals in random order, ``l`` uniform in 1..min(L, unsafe); half of
   every batch is drawn from samples with unsafe proposals, the other half uniformly (mostly with an
   empty trace, so the plain behaviour is kept).
4. **Check.** On the held-out clips' samples with an unsafe first proposal (the medoid of the M), the
   critic's acceptance of one corrected round (the same noise, now with that proposal as the trace)
   against one round of rejection sampling (fresh noise, no trace).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rad2_core.config import require
from rad2_planner.diffusion import NoiseSchedule, SamplerSpec, initial_noise
from rad2_planner.networks import ModelConfig, PlannerModel
from rad2_planner.runtime.base import SCENE_INPUTS
from rad2_planner.runtime.torch_backend import TorchBackend

from rad2_training.imitation import build_cache, diffusion_loss, lr_at, start_run, to_torch


def self_correcting_copy(base: PlannerModel, trace_len: int) -> PlannerModel:
    """``base``'s weights in a model with a fresh correction encoder for traces of ``trace_len``."""
    cfg = ModelConfig.from_dict({**base.cfg.to_dict(), "correction_trace_len": int(trace_len)})
    model = PlannerModel(cfg, base.normalizer)
    missing, unexpected = model.load_state_dict(base.state_dict(), strict=False)
    assert not unexpected and all(k.startswith("correction.") for k in missing), (missing, unexpected)
    model.discriminator_trained = base.discriminator_trained
    return model


@torch.no_grad()
def mine_unsafe_proposals(model: PlannerModel, critic, cache, indices: np.ndarray, m: int, spec: SamplerSpec,
                          schedule: NoiseSchedule, threshold: float, trace_len: int, seed: int,
                          batch: int = 32, progress: bool = True
                          ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For each sample of ``indices``: ``(unsafe [N, L, T, 2] normalised, n_unsafe [N], first_unsafe [N])``.

    ``unsafe`` holds up to L proposals with critic risk >= ``threshold`` (highest first), ``first_unsafe``
    whether the medoid proposal (the plain planner's fallback pick) was one of them.
    """
    from rad2_planner.candidates import medoid_index
    from tqdm import tqdm

    backend = TorchBackend(model)
    t_plan = model.cfg.plan_points
    unsafe = np.zeros((len(indices), trace_len, t_plan, 2), np.float32)
    count = np.zeros(len(indices), np.int64)
    first = np.zeros(len(indices), bool)
    for s in tqdm(range(0, len(indices), batch), desc="mining unsafe proposals", disable=not progress):
        idx = indices[s:s + batch]
        data = cache.batch(idx, model.cfg)
        order = np.argsort(idx, kind="stable")  # cache.batch returns rows in sorted order
        rows = np.empty_like(order)
        rows[order] = np.arange(len(idx))
        data = {k: v[rows] for k, v in data.items()}
        scene = backend.encode({k: data[k] for k in SCENE_INPUTS})
        z = backend.generate(initial_noise(len(idx), m, t_plan, seed + s), scene, schedule, spec)
        speed = data["ego_state"][:, 0]
        cands = model.normalizer.denormalize(z, speed[:, None]).astype(np.float32)
        _, p = critic(torch.from_numpy(cands), torch.from_numpy(data["agents"]),
                      torch.from_numpy(data["agents_mask"]), torch.from_numpy(data["ego_state"]))
        p = p.numpy()
        for j in range(len(idx)):
            bad = np.flatnonzero(p[j] >= threshold)
            bad = bad[np.argsort(-p[j, bad])][:trace_len]
            unsafe[s + j, :len(bad)] = z[j, bad]
            count[s + j] = len(bad)
            first[s + j] = p[j, medoid_index(cands[j])] >= threshold
    return unsafe, count, first


def draw_traces(rng: np.random.Generator, unsafe: np.ndarray, count: np.ndarray, rows: np.ndarray,
                trace_len: int) -> tuple[np.ndarray, np.ndarray]:
    """A training trace per row: ``l ~ U{1..min(L, count)}`` of its unsafe proposals in random order (an
    empty trace where it has none)."""
    t_plan = unsafe.shape[2]
    trace = np.zeros((len(rows), trace_len, t_plan, 2), np.float32)
    mask = np.zeros((len(rows), trace_len), bool)
    for j, i in enumerate(rows):
        n = int(min(trace_len, count[i]))
        if n == 0:
            continue
        length = int(rng.integers(1, n + 1))
        pick = rng.permutation(int(count[i]))[:length]
        trace[j, :length] = unsafe[i, pick]
        mask[j, :length] = True
    return trace, mask


@torch.no_grad()
def correction_check(model: PlannerModel, base: PlannerModel, critic, cache, indices: np.ndarray,
                     unsafe: np.ndarray, m: int, spec: SamplerSpec, schedule: NoiseSchedule, threshold: float,
                     seed: int) -> dict[str, float]:
    """Critic acceptance of one corrected round vs one rejection-sampling round, on ``indices`` (rows
    of the cache whose medoid proposal is unsafe; ``unsafe[i, 0]`` is then among the mined ones and the
    trace is the highest-risk proposal)."""
    from rad2_planner.candidates import medoid_index

    if len(indices) == 0:
        return {"samples": 0}
    corr, plain = TorchBackend(model), TorchBackend(base)
    accepted = {"self_correction": 0, "rejection_sampling": 0}
    for s in range(0, len(indices), 32):
        rows = np.arange(s, min(s + 32, len(indices)))
        idx = indices[rows]
        data = cache.batch(idx, model.cfg)
        order = np.argsort(idx, kind="stable")
        inv = np.empty_like(order)
        inv[order] = np.arange(len(idx))
        data = {k: v[inv] for k, v in data.items()}
        scene = plain.encode({k: data[k] for k in SCENE_INPUTS})
        speed = data["ego_state"][:, 0][:, None]
        trace = np.zeros((len(idx), model.cfg.correction_trace_len, *unsafe.shape[2:]), np.float32)
        mask = np.zeros(trace.shape[:2], bool)
        trace[:, 0], mask[:, 0] = unsafe[rows, 0], True
        x_init = initial_noise(len(idx), m, model.cfg.plan_points, seed + 7919 + s)
        corrected_scene = corr.extend_scene(scene, trace, mask)
        outs = {"self_correction": corr.generate(x_init, corrected_scene, schedule, spec),
                "rejection_sampling": plain.generate(x_init, scene, schedule, spec)}
        for name, z in outs.items():
            cands = model.normalizer.denormalize(z, speed).astype(np.float32)
            pick = np.array([medoid_index(c) for c in cands])
            _, p = critic(torch.from_numpy(cands[np.arange(len(idx)), pick][:, None]),
                          torch.from_numpy(data["agents"]), torch.from_numpy(data["agents_mask"]),
                          torch.from_numpy(data["ego_state"]))
            accepted[name] += int((p.numpy()[:, 0] < threshold).sum())
    return {"samples": int(len(indices)), **{f"accepted_{k}": v / len(indices) for k, v in accepted.items()}}


def train_self_correction(
    dataset: str | Path,
    out_dir: str | Path,
    base_checkpoint: str | Path,
    critic_checkpoint: str | Path,
    params: dict[str, Any],
    overrides: dict[str, Any] | None = None,
    workers: int = 2,
    progress: bool = True,
    command: str | None = None,
    time_budget_s: float | None = None,
) -> tuple[PlannerModel, dict[str, Any]]:
    """Mine, fine-tune and check (module doc); writes ``<out>/final`` and returns the model and the
    check's figures. ``params``: every file of params/ as loaded, merged."""
    from rad2_planner.networks.critic import CollisionCritic
    from torch.utils.tensorboard import SummaryWriter
    from tqdm import tqdm

    tp = dict(require(params, "imitation"))
    sc = dict(require(params, "self_correction"))
    # ``overrides``: ``self_correction.*`` values the entry point checked against the schema
    sc.update(overrides or {})
    seed = int(sc["seed"])
    rng, out = start_run(seed, out_dir)
    from rad2_planner.policy import resolve_path

    base = PlannerModel.load(base_checkpoint).eval()
    critic = CollisionCritic.load(critic_checkpoint).eval()
    cfg = base.cfg
    cache = build_cache(dataset, tp, cfg.plan_dt, cfg.plan_points, resolve_path(tp["cache"]["dir"]), params,
                        workers, progress)
    n = len(cache)
    clip_of = np.asarray(cache.meta["clip_index"])
    clips = np.unique(clip_of)
    held_out = np.random.default_rng(seed + 1).permutation(clips)[:max(1, int(round(len(clips) * float(
        sc["val_fraction"]))))]
    is_val = np.isin(clip_of, held_out)
    pool = np.arange(n)
    if len(pool) > int(sc["max_samples"]):
        pool = np.sort(np.random.default_rng(seed + 2).choice(pool, int(sc["max_samples"]), replace=False))
    L, m, thr = int(sc["trace_len"]), int(sc["num_candidates"]), float(sc["critic_threshold"])
    spec = SamplerSpec(int(require(params, "planner.num_denoise_steps")),
                       str(require(params, "planner.sampler")),
                       float(require(params, "diffusion.x0_clip")))
    schedule = NoiseSchedule(cfg.num_train_steps, require(params, "diffusion.schedule"))
    t0 = time.time()
    unsafe, count, first = mine_unsafe_proposals(base, critic, cache, pool, m, spec, schedule, thr, L, seed,
                                                 progress=progress)
    mining_s = time.time() - t0
    train_rows = np.flatnonzero(~is_val[pool])
    risky_rows = train_rows[count[train_rows] > 0]
    val_rows = np.flatnonzero(is_val[pool] & first)
    tqdm.write(f"mined {len(pool)} samples in {mining_s:.0f} s: {int((count > 0).sum())} with an unsafe "
               f"proposal, {int(first.sum())} with an unsafe medoid; {len(val_rows)} held-out check rows")
    if len(risky_rows) == 0:
        raise RuntimeError(f"{dataset}: no training sample has a proposal the critic rejects at threshold "
                           f"{thr}; nothing to learn a correction from")

    model = self_correcting_copy(base, L)
    for p in model.encoder.parameters():
        p.requires_grad_(False)
    weights = list(model.denoiser.parameters()) + list(model.correction.parameters())
    opt = torch.optim.AdamW(weights, lr=float(sc["learning_rate"]), weight_decay=float(tp["weight_decay"]))
    gen = torch.Generator().manual_seed(seed + 3)
    writer = SummaryWriter(str(out / "tb"))
    max_steps, bs, draws = int(sc["max_steps"]), int(sc["batch_size"]), int(tp["noise_draws"])
    model.train()
    model.encoder.eval()
    t_start, ema, step = time.time(), None, 0
    bar = tqdm(range(max_steps), desc="imitation with correction", disable=not progress)
    for step in bar:
        lr = lr_at(step, float(sc["learning_rate"]), int(sc["warmup_steps"]), max_steps)
        for g in opt.param_groups:
            g["lr"] = lr
        rows = np.concatenate([rng.choice(risky_rows, bs // 2), rng.choice(train_rows, bs - bs // 2)])
        order = np.argsort(pool[rows], kind="stable")
        rows = rows[order]  # cache.batch sorts its indices; keep the traces aligned with it
        trace, mask = draw_traces(rng, unsafe, count, rows, L)
        batch = to_torch(cache.batch(pool[rows], model.cfg), torch.device("cpu"))
        loss = diffusion_loss(model, batch, schedule, draws, gen,
                              correction=(torch.from_numpy(trace), torch.from_numpy(mask)))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(weights, float(tp["grad_clip"]))
        opt.step()
        lv = float(loss.detach())
        ema = lv if ema is None else 0.98 * ema + 0.02 * lv
        if step % 25 == 0:
            writer.add_scalar("train/loss", lv, step)
            bar.set_postfix(loss=f"{ema:.4f}")
        if time_budget_s is not None and time.time() - t_start > time_budget_s:
            tqdm.write(f"time budget of {time_budget_s:.0f} s reached at step {step + 1}")
            break
    writer.close()
    model.eval()
    check = correction_check(model, base, critic, cache, pool[val_rows], unsafe[val_rows], m, spec, schedule,
                             thr, seed)
    tqdm.write("held-out check: " + json.dumps(check))
    model.training_info = {
        "command": command or " ".join(sys.argv),
        "seed": seed,
        "dataset": str(dataset),
        "base_checkpoint": str(base_checkpoint),
        "critic_checkpoint": str(critic_checkpoint),
        "hyper_parameters": sc,
        "mined_samples": int(len(pool)),
        "samples_with_unsafe_proposals": int((count > 0).sum()),
        "mining_s": round(mining_s, 1),
        "steps": int(step + 1),
        "training_s": round(time.time() - t_start, 1),
        "final_loss_ema": ema,
        "held_out_check": check,
        "previous_training": base.training_info,
    }
    model.save(out / "final")
    return model, check
