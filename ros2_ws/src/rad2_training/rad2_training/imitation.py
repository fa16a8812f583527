"""Imitation pretraining of the RAD-2 generator (scene encoder + DiT denoiser) on clip datasets.

Samples: every ``frame_stride``-th step t of each clip whose 4 s future is logged. The input is the
observation at t; the target is the logged ego future at ``(k+1)·plan_dt`` in the ego frame of t.

Augmentation (ChauffeurNet/BEV-Warp style recovery): with probability ``augmentation.probability`` the
observation is built at a perturbed ego pose P' = P ∘ δ (δ lateral/longitudinal/yaw, clipped Gaussian)
and the target is the logged future blended back from the perturbed position, offset weight
``1 − min(1, t_k / recovery_time_s)``, expressed in the perturbed ego frame — so the generator learns
to steer back onto the log after the deviations a closed loop produces.

Feature cache: the observations and targets of all samples are computed once (in parallel workers)
into memory-mapped arrays under ``cache.dir/<key>/`` (BEV in float16); the key hashes the dataset
index, the BEV/token/planner geometry and the sampling/augmentation settings, so a change rebuilds.

Loss: the denoiser predicts the clean normalised trajectory x0 (see ``networks/generator.py``);
``MSE(x0_hat, x0)`` with ``t ~ U[0, N−1]``, ``noise_draws`` noisy copies per scene (the scene is
encoded once per sample and shared by its draws).

One module, a little over 600 lines: the feature cache, the sampler and the training loop share the
cache layout and the augmentation; the networks live in rad2_planner.networks.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import sys
import time
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rad2_core.config import ParameterError, require
from rad2_core.geometry import se2_compose, world_to_ego
from rad2_core.open_loop_metrics import OpenLoopAccumulator, logged_future
from rad2_core.tokens import MAP_FEATURES
from rad2_planner.diffusion import NoiseSchedule, initial_noise, sample
from rad2_planner.networks import ModelConfig, PlannerModel, TrajectoryNormalizer
from rad2_planner.runtime.base import SCENE_INPUTS
from rad2_planner.runtime.torch_backend import TorchBackend

FIELDS = (*SCENE_INPUTS, "target")


# ------------------------------------------------------------------------------------------------
# samples
# ------------------------------------------------------------------------------------------------
def sample_steps(num_steps: int, dt: float, plan_dt: float, plan_points: int, stride: int) -> list[int]:
    """Steps t whose full plan horizon is logged."""
    horizon = int(round(plan_dt / dt)) * plan_points
    return list(range(0, num_steps - horizon, stride))


def draw_perturbation(rng: np.random.Generator, aug: dict[str, Any]) -> np.ndarray:
    """δ = (dx, dy, dyaw) in the logged ego frame, or zeros (no perturbation)."""
    if rng.random() >= float(aug["probability"]):
        return np.zeros(3)
    dx = rng.normal(0.0, float(aug["longitudinal_std_m"]))
    dy = np.clip(rng.normal(0.0, float(aug["lateral_std_m"])), -aug["max_lateral_m"], aug["max_lateral_m"])
    dyaw = np.clip(rng.normal(0.0, float(aug["yaw_std_rad"])), -aug["max_yaw_rad"], aug["max_yaw_rad"])
    return np.array([dx, dy, dyaw])


def recovery_target(
    clip, t: int, delta: np.ndarray, plan_dt: float, plan_points: int, recovery_time: float
) -> np.ndarray:
    """[T, 2] target in the ego frame of the (perturbed) pose P ∘ δ, blending back to the log."""
    stride = int(round(plan_dt / clip.dt))
    idx = t + stride * (np.arange(plan_points) + 1)
    pose = clip.ego_pose(t)
    new_pose = se2_compose(pose, delta)
    fut = np.stack([clip.ego_x[idx], clip.ego_y[idx]], -1)
    times = (np.arange(plan_points) + 1) * plan_dt
    w = np.clip(times / max(recovery_time, 1e-6), 0.0, 1.0)
    fut = fut + (1.0 - w)[:, None] * (new_pose[:2] - pose[:2])[None]
    return world_to_ego(fut, new_pose).astype(np.float32)


def _clip_samples(job):
    """Worker: observations + targets of one clip's samples."""
    from rad2_core.bev import snapshot_from_clip
    from rad2_core.observation import build_observation
    from rad2_core.storage import load_clip

    path, maps_dir, steps, deltas, plan_dt, plan_points, recovery, params = job
    torch.set_num_threads(1)
    clip = load_clip(path, maps_dir=maps_dir)
    out = {k: [] for k in FIELDS}
    for t, delta in zip(steps, deltas):
        snap = snapshot_from_clip(clip, t, params, params)
        pose = se2_compose(clip.ego_pose(t), delta)
        obs = build_observation(snap, ego_pose=pose, params=params)
        for k in FIELDS[:-1]:
            out[k].append(getattr(obs, k))
        out["target"].append(recovery_target(clip, t, delta, plan_dt, plan_points, recovery))
    return {k: np.stack(v) for k, v in out.items()}


@dataclass
class FeatureCache:
    """Memory-mapped arrays of one dataset's samples (see module docstring); ``channels``: the BEV
    channel names they were rendered with (``bev.channels`` of the params that built them)."""

    directory: Path
    arrays: dict[str, np.ndarray]
    meta: dict[str, Any]
    channels: tuple[str, ...]

    def __len__(self) -> int:
        return int(self.meta["num_samples"])

    def batch(self, idx: np.ndarray, model_cfg: ModelConfig | None = None) -> dict[str, np.ndarray]:
        """Rows ``idx`` (sorted); with ``model_cfg``, only the BEV channels and map features that model
        takes (a checkpoint trained before one was added to params/bev.yaml)."""
        idx = np.sort(idx)
        out = {k: np.asarray(self.arrays[k][idx]) for k in FIELDS}
        out["bev"] = out["bev"].astype(np.float32)
        return out if model_cfg is None else model_cfg.select_inputs(out, self.channels)


def _cache_key(dataset: Path, tp: dict[str, Any], plan_dt: float, plan_points: int, params: dict[str, Any]
               ) -> str:
    h = hashlib.sha256((dataset / "index.json").read_bytes())
    # what params/bev.yaml holds (its blocks), hashed as the file's dict so earlier caches stay valid
    bev_file = {block: params[block] for block in ("adapters", "bev", "tokens")}
    h.update(json.dumps(bev_file, sort_keys=True, default=str).encode())
    h.update(
        json.dumps(
            {
                "stride": tp["frame_stride"],
                "aug": tp["augmentation"],
                "seed": tp["seed"],
                "plan_dt": plan_dt,
                "plan_points": plan_points,
                "map_features": MAP_FEATURES,
                "v": 1,
            },
            sort_keys=True,
        ).encode()
    )
    return h.hexdigest()[:16]


def build_cache(
    dataset: str | Path,
    tp: dict[str, Any],
    plan_dt: float,
    plan_points: int,
    cache_root: str | Path,
    params: dict[str, Any],
    workers: int = 2,
    progress: bool = True,
) -> FeatureCache:
    """Compute (or reopen) the feature cache of ``dataset`` (``params``: params/bev.yaml and
    vehicle.yaml as loaded, merged: the observations' geometry)."""
    from rad2_core.storage import read_index
    from tqdm import tqdm

    dataset = Path(dataset)
    index = read_index(dataset)
    key = _cache_key(dataset, tp, plan_dt, plan_points, params)
    channels = tuple(str(c) for c in require(params, "bev.channels"))
    cdir = Path(cache_root) / f"{dataset.name}-{key}"
    meta_path = cdir / "meta.json"
    if meta_path.is_file():
        meta = json.loads(meta_path.read_text())
        return FeatureCache(cdir, _open_arrays(cdir, meta, "r"), meta, channels)
    rng = np.random.default_rng(int(tp["seed"]))
    jobs, sample_clip, sample_t, sample_pert = [], [], [], []
    for ci, e in enumerate(index["clips"]):
        steps = sample_steps(int(e["steps"]), float(e["dt"]), plan_dt, plan_points, int(tp["frame_stride"]))
        if not steps:
            continue
        deltas = [draw_perturbation(rng, tp["augmentation"]) for _ in steps]
        jobs.append(
            (
                str(dataset / e["file"]),
                str(dataset / "maps"),
                steps,
                deltas,
                plan_dt,
                plan_points,
                float(tp["augmentation"]["recovery_time_s"]),
                params,
            )
        )
        sample_clip += [ci] * len(steps)
        sample_t += steps
        sample_pert += [bool(np.any(d != 0)) for d in deltas]
    n = len(sample_t)
    if n == 0:
        raise ValueError(
            f"dataset {dataset}: no clip is long enough for a {plan_points * plan_dt} s plan horizon"
        )
    cdir.mkdir(parents=True, exist_ok=True)
    first = _clip_samples(jobs[0])
    shapes = {k: list(v.shape[1:]) for k, v in first.items()}
    dtypes = {k: ("float16" if k == "bev" else str(v.dtype)) for k, v in first.items()}
    meta = {
        "num_samples": n,
        "shapes": shapes,
        "dtypes": dtypes,
        "dataset": str(dataset),
        "key": key,
        "clip_index": sample_clip,
        "t": sample_t,
        "perturbed": sample_pert,
        "clip_ids": [e["clip_id"] for e in index["clips"]],
    }
    arrays = _open_arrays(cdir, meta, "w+")
    pos = 0

    def put(res):
        nonlocal pos
        m = len(res["target"])
        for k in FIELDS:
            arrays[k][pos : pos + m] = res[k]
        pos += m

    bar = tqdm(total=len(jobs), desc=f"feature cache {dataset.name}", unit="clip", disable=not progress)
    put(first)
    bar.update(1)
    if workers > 1 and len(jobs) > 1:
        with get_context("fork").Pool(workers) as pool:
            for res in pool.imap(_clip_samples, jobs[1:], chunksize=2):
                put(res)
                bar.update(1)
    else:
        for job in jobs[1:]:
            put(_clip_samples(job))
            bar.update(1)
    bar.close()
    for a in arrays.values():
        a.flush()
    meta_path.write_text(json.dumps(meta))
    return FeatureCache(cdir, _open_arrays(cdir, meta, "r"), meta, channels)


def _open_arrays(cdir: Path, meta: dict[str, Any], mode: str) -> dict[str, np.ndarray]:
    n = meta["num_samples"]
    return {
        k: np.lib.format.open_memmap(
            cdir / f"{k}.npy",
            mode=mode,
            dtype=meta["dtypes"][k],
            shape=(n, *meta["shapes"][k]) if mode == "w+" else None,
        )
        for k in FIELDS
    }


# ------------------------------------------------------------------------------------------------
# training
# ------------------------------------------------------------------------------------------------
def bev_channel_scale(cache: FeatureCache, rng: np.random.Generator, n: int = 256) -> list[float]:
    """Per-channel multiplier 1 / max(1, p99 |value|) so every BEV channel is O(1)."""
    idx = rng.choice(len(cache), size=min(n, len(cache)), replace=False)
    bev = cache.batch(idx)["bev"]
    p99 = np.percentile(np.abs(bev), 99.5, axis=(0, 2, 3))
    return [float(1.0 / max(1.0, v)) for v in p99]


def to_torch(batch: dict[str, np.ndarray], device: torch.device) -> dict[str, torch.Tensor]:
    return {k: torch.from_numpy(np.ascontiguousarray(v)).to(device) for k, v in batch.items()}


def diffusion_loss(
    model: PlannerModel,
    batch: dict[str, torch.Tensor],
    schedule: NoiseSchedule,
    draws: int,
    gen: torch.Generator,
    correction: tuple[torch.Tensor, torch.Tensor] | None = None,
    sample_weight: torch.Tensor | None = None,
    reference: PlannerModel | None = None,
    kl_weight: float = 0.0,
) -> torch.Tensor:
    """x0-prediction MSE in the normalised space, ``draws`` noise levels per encoded scene.

    ``correction``: ``(trace [B, L, T, 2], mask [B, L])`` of a self-correcting generator
    (``training/correction.py``), appended to the scene tokens by its correction encoder.
    ``sample_weight [B]`` weighs each sample's error (reward-weighted regression). ``reference`` (a
    frozen model of the same kind) adds ``kl_weight`` × the squared distance between the two models' x0
    predictions at the same noisy inputs: for two denoisers on one noise schedule the KL divergence of
    their reverse processes is a weighted sum of exactly these terms, so it keeps a fine-tuned generator
    near the one it started from."""
    def x0_prediction(net: PlannerModel, zt: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        tokens, bias, cond, _ = net.encoder(*(batch[k] for k in SCENE_INPUTS))
        if correction is not None:
            tokens, bias = net.correction(tokens, bias, *correction)
        tokens, bias, cond = (x.repeat_interleave(draws, 0) for x in (tokens, bias, cond))
        return net.denoiser(zt[:, None], t, tokens, bias, cond)[:, 0]

    speed = batch["ego_state"][:, 0]
    z0 = model.normalizer.normalize(batch["target"], speed)  # B T 2
    b = z0.shape[0]
    z0 = z0.repeat_interleave(draws, 0)
    t = torch.rand(b * draws, generator=gen) * (schedule.n - 1)
    eps = torch.randn(z0.shape, generator=gen)
    zt = schedule.add_noise(z0, eps, t.numpy())
    x0_hat = x0_prediction(model, zt, t)
    err = ((x0_hat - z0) ** 2).mean(dim=(1, 2))  # B*draws
    if sample_weight is not None:
        err = err * sample_weight.to(err.dtype).repeat_interleave(draws)
    loss = err.mean()
    if reference is not None and kl_weight > 0:
        with torch.no_grad():
            x0_ref = x0_prediction(reference, zt, t)
        loss = loss + kl_weight * torch.mean((x0_hat - x0_ref) ** 2)
    return loss


@torch.no_grad()
def open_loop_eval(
    model: PlannerModel,
    cache: FeatureCache,
    indices: np.ndarray,
    clips: dict[int, Any],
    schedule: NoiseSchedule,
    m: int,
    k: int,
    sampler: str,
    x0_clip: float,
    seed: int,
    bev_geometry: tuple[tuple[float, float], float, int] | None,
    params: dict[str, Any],
    batch: int = 32,
) -> dict[str, float]:
    """Open-loop metrics of the medoid-selected plan (no discriminator yet) on ``indices`` (``params``:
    params/sim.yaml and vehicle.yaml as loaded, merged: the metrics' settings)."""
    from rad2_planner.candidates import medoid_index

    was_training = model.training
    model.eval()
    backend = TorchBackend(model)
    acc = OpenLoopAccumulator.from_params(params, params)
    for s in range(0, len(indices), batch):
        idx = np.sort(indices[s : s + batch])
        data = cache.batch(idx, model.cfg)
        scene = backend.encode({key: data[key] for key in SCENE_INPUTS})
        z = sample(
            lambda x, t, scene=scene: backend.denoise(x, t, scene),
            initial_noise(len(idx), m, model.cfg.plan_points, seed + s),
            schedule,
            k,
            sampler,
            x0_clip,
        )
        cands = model.normalizer.denormalize(z, data["ego_state"][:, 0][:, None])
        for j, i in enumerate(idx):
            clip = clips[int(cache.meta["clip_index"][i])]
            fut = logged_future(clip, int(cache.meta["t"][i]), model.cfg.plan_dt, model.cfg.plan_points)
            drivable = None
            if bev_geometry is not None:
                drivable = data["bev"][j, bev_geometry[2]]
            acc.add(
                cands[j],
                medoid_index(cands[j]),
                fut,
                drivable,
                bev_geometry[0] if bev_geometry else None,
                bev_geometry[1] if bev_geometry else None,
            )
    model.train(was_training)
    return acc.summary()


def fit_normalizer(cache: FeatureCache, train_idx: np.ndarray, tp: dict[str, Any], plan_dt: float
                   ) -> TrajectoryNormalizer:
    """The trajectory normaliser of the training samples' targets (``imitation.normalizer_*``)."""
    rows = np.sort(train_idx)
    return TrajectoryNormalizer.fit(
        np.asarray(cache.arrays["target"][rows]), np.asarray(cache.arrays["ego_state"][rows, 0]), plan_dt,
        speed_step=float(tp["normalizer_speed_step_mps"]),
        prior_samples=float(tp["normalizer_prior_samples"]),
    )


def lr_at(step: int, base: float, warmup: int, total: int) -> float:
    if step < warmup:
        return base * (step + 1) / warmup
    p = min(1.0, (step - warmup) / max(1, total - warmup))
    return base * (0.05 + 0.95 * 0.5 * (1.0 + math.cos(math.pi * p)))


def start_run(seed: int, out_dir: str | Path) -> tuple[np.random.Generator, Path]:
    """Seed torch, size its thread pool (``RAD2_TORCH_THREADS``, default 1: the cache workers and the
    simulator share the cores) and create the run directory; returns the run's NumPy generator."""
    torch.manual_seed(seed)
    threads = os.environ.get("RAD2_TORCH_THREADS", "1")
    if not (threads.isdigit() and 1 <= int(threads) <= 256):
        raise ParameterError(f"RAD2_TORCH_THREADS: expected an integer in 1..256, got {threads!r}")
    torch.set_num_threads(int(threads))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    return np.random.default_rng(seed), out


def train(
    dataset: str | Path,
    out_dir: str | Path,
    params: dict[str, Any],
    overrides: dict[str, Any] | None = None,
    resume: bool = False,
    workers: int = 2,
    progress: bool = True,
    command: str | None = None,
    time_budget_s: float | None = None,
    init_from: str | Path | None = None,
) -> PlannerModel:
    """Run IL pretraining; writes checkpoints to ``out_dir`` (``last/`` while training, ``final/``).
    ``params``: every file of params/ as loaded, merged (:func:`rad2_core.config.load_merged`)."""
    from rad2_core.bev import get_config
    from rad2_core.storage import load_clip, read_index
    from torch.utils.tensorboard import SummaryWriter
    from tqdm import tqdm

    tp = dict(require(params, "imitation"))
    tp.update(overrides or {})
    seed = int(tp["seed"])
    rng, out = start_run(seed, out_dir)
    pp = require(params, "planner")
    plan_dt, plan_points = float(pp["plan_dt"]), int(pp["plan_points"])
    from rad2_planner.policy import resolve_path

    cache = build_cache(
        dataset, tp, plan_dt, plan_points, resolve_path(tp["cache"]["dir"]), params, workers, progress
    )
    n = len(cache)
    clip_of = np.asarray(cache.meta["clip_index"])
    n_clips = int(clip_of.max()) + 1
    perm = np.random.default_rng(seed + 1).permutation(n_clips)
    n_val = max(1, int(round(n_clips * float(tp["val_fraction"])))) if n_clips > 1 else 0
    val_clips = set(perm[:n_val].tolist())
    is_val = np.isin(clip_of, list(val_clips))
    perturbed = np.asarray(cache.meta["perturbed"], bool)
    train_idx = np.nonzero(~is_val)[0] if n_val else np.arange(n)
    val_idx = np.nonzero(is_val & ~perturbed)[0]
    n_val_samples = int(tp["val_samples"])
    if len(val_idx) > n_val_samples:
        val_idx = np.random.default_rng(seed + 2).choice(val_idx, n_val_samples, replace=False)

    cfg = ModelConfig.from_params(params, params)
    state_path = out / "last" / "trainer_state.pt"
    if resume and state_path.is_file():
        model = PlannerModel.load(out / "last")
        model.train()
        state = torch.load(state_path, weights_only=False)
        start_step = int(state["step"])
    elif init_from is not None:
        # fine-tune: weights, normalisation and BEV scaling of an earlier run, fresh optimiser; with
        # refit_normalizer the network learns its targets in the new normalised space
        model = PlannerModel.load(init_from)
        if not model.takes_inputs_of(cfg):
            # params/bev.yaml gained a channel or a token feature since: start with their weights at zero
            model = model.with_inputs_of(cfg)
        if bool(tp["refit_normalizer"]):
            model.normalizer = fit_normalizer(cache, train_idx, tp, plan_dt)
        state, start_step = None, 0
    else:
        normalizer = fit_normalizer(cache, train_idx, tp, plan_dt)
        cfg.bev_channel_scale = bev_channel_scale(cache, rng)
        model = PlannerModel(cfg, normalizer)
        state, start_step = None, 0
    model.train()
    weights = list(model.encoder.parameters()) + list(model.denoiser.parameters())
    opt = torch.optim.AdamW(weights, lr=float(tp["learning_rate"]), weight_decay=float(tp["weight_decay"]))
    gen = torch.Generator().manual_seed(seed + 3)
    if state is not None:
        opt.load_state_dict(state["optimizer"])
        gen.set_state(state["generator"])
        rng = np.random.default_rng()
        rng.bit_generator.state = state["numpy_rng"]
    schedule = NoiseSchedule(cfg.num_train_steps, require(params, "diffusion.schedule"))
    x0_clip = float(require(params, "diffusion.x0_clip"))
    index = read_index(dataset)
    val_clip_objs = {
        ci: load_clip(Path(dataset) / index["clips"][ci]["file"], maps_dir=Path(dataset) / "maps")
        for ci in sorted(val_clips)
    }
    bcfg = get_config(params)
    ch = list(bcfg.channels).index("drivable_area") if "drivable_area" in bcfg.channels else None
    bev_geometry = ((bcfg.origin_x, bcfg.origin_y), bcfg.resolution, ch) if ch is not None else None

    writer = SummaryWriter(str(out / "tb"))
    max_steps, bs, draws = int(tp["max_steps"]), int(tp["batch_size"]), int(tp["noise_draws"])
    info = {
        "init_from": str(init_from) if init_from else None,
        "previous_training": model.training_info if init_from else None,
        "command": command or " ".join(sys.argv),
        "seed": seed,
        "dataset": str(dataset),
        "train_samples": int(len(train_idx)),
        "val_samples": int(len(val_idx)),
        "val_clips": len(val_clips),
        "hyper_parameters": tp,
    }
    t_start = time.time()
    history: list[dict[str, float]] = []
    ema = None
    bar = tqdm(
        range(start_step, max_steps), desc="IL", initial=start_step, total=max_steps, disable=not progress
    )
    step = start_step
    for step in bar:
        lr = lr_at(step, float(tp["learning_rate"]), int(tp["warmup_steps"]), max_steps)
        for g in opt.param_groups:
            g["lr"] = lr
        batch = to_torch(
            cache.batch(rng.choice(train_idx, size=min(bs, len(train_idx)), replace=False), model.cfg),
            torch.device("cpu"),
        )
        loss = diffusion_loss(model, batch, schedule, draws, gen)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(weights, float(tp["grad_clip"]))
        opt.step()
        lv = float(loss.detach())
        ema = lv if ema is None else 0.98 * ema + 0.02 * lv
        if step % int(tp["log_every"]) == 0:
            writer.add_scalar("train/loss", lv, step)
            writer.add_scalar("train/loss_ema", ema, step)
            writer.add_scalar("train/lr", lr, step)
            writer.add_scalar("train/grad_norm", float(gn), step)
            bar.set_postfix(loss=f"{ema:.4f}", lr=f"{lr:.1e}")
        last = step == max_steps - 1
        over_budget = time_budget_s is not None and time.time() - t_start > time_budget_s
        if len(val_idx) and ((step + 1) % int(tp["val_every"]) == 0 or last or over_budget):
            metrics = open_loop_eval(
                model,
                cache,
                val_idx,
                val_clip_objs,
                schedule,
                int(tp["num_eval_candidates"]),
                int(tp["num_eval_steps"]),
                require(params, "planner.sampler"),
                x0_clip,
                seed,
                bev_geometry,
                params,
            )
            for key, v in metrics.items():
                writer.add_scalar(f"val/{key}", v, step + 1)
            history.append({"step": step + 1, "loss_ema": ema, **metrics})
            tqdm.write(
                f"step {step + 1}: loss {ema:.4f} " + " ".join(f"{k} {v:.3f}" for k, v in metrics.items())
            )
        if (step + 1) % int(tp["checkpoint_every"]) == 0 or last or over_budget:
            _save(model, opt, gen, rng, step + 1, out / "last", info, history, t_start)
        if over_budget:
            tqdm.write(f"time budget of {time_budget_s:.0f} s reached at step {step + 1}")
            break
    writer.close()
    if bool(tp["discriminator_encoder_pretrain"]):
        model.discriminator.init_from_scene_encoder(model.encoder)
    _save(model, opt, gen, rng, step + 1, out / "final", info, history, t_start, trainer_state=False)
    return model


def _save(model, opt, gen, rng, step, directory: Path, info, history, t_start, trainer_state: bool = True):
    model.training_info = {
        **info,
        "steps": int(step),
        "wall_time_s": round(time.time() - t_start, 1),
        "history": history,
    }
    model.save(directory)
    if trainer_state:
        torch.save(
            {
                "step": step,
                "optimizer": opt.state_dict(),
                "generator": gen.get_state(),
                "numpy_rng": rng.bit_generator.state,
            },
            directory / "trainer_state.pt",
        )


def evaluate_open_loop(
    checkpoint: str | Path,
    dataset: str | Path,
    params: dict[str, Any],
    stride: int = 10,
    backend: str | None = None,
    selection: str | None = None,
    progress: bool = True,
) -> dict[str, float]:
    """Open-loop metrics (``open_loop_metrics``) of a checkpoint on every ``stride``-th step of a dataset.

    Plans come from :class:`Rad2Policy` exactly as on the vehicle (default backend and M, K from
    ``params/planner.yaml``); observations are built at the logged poses. ``params``: every file of
    params/ as loaded, merged.
    """
    from rad2_core.bev import get_config, snapshot_from_clip
    from rad2_core.observation import build_observation
    from rad2_core.storage import iter_dataset, read_index
    from rad2_planner.policy import Rad2Policy
    from tqdm import tqdm

    policy = Rad2Policy.from_params(params, checkpoint_dir=checkpoint, backend=backend,
                                    fallback_selection=selection)
    bcfg = get_config(params)
    ch = list(bcfg.channels).index("drivable_area")
    acc = OpenLoopAccumulator.from_params(params, params)
    n = len(read_index(dataset)["clips"])
    for clip in tqdm(
        iter_dataset(dataset), total=n, desc=f"open loop {Path(dataset).name}", disable=not progress
    ):
        policy.reset(seed=0)
        steps = sample_steps(clip.num_steps, clip.dt, policy.plan_dt, policy.cfg.plan_points, stride)
        for t in steps:
            obs = build_observation(snapshot_from_clip(clip, t, params, params), params=params)
            r = policy.plan(obs)
            fut = logged_future(clip, t, policy.plan_dt, policy.cfg.plan_points)
            acc.add(
                r.candidates, r.selected, fut, obs.bev[ch], (bcfg.origin_x, bcfg.origin_y), bcfg.resolution
            )
    return acc.summary()
