"""Collision critic: the probability that executing one ego candidate collides within ``horizon_s``.

The safety layer of the planner (``safety_layer.*`` in params/planner.yaml, :mod:`rad2_planner.policy`)
asks it, before execution, whether a candidate trajectory is about to hit one of the observed agents;
its labels come from the log-replay simulator (``rad2_training.critic_data``), not from a hand rule.

Inputs (ego frame of the observation, the same tensors the planner already holds):
``trajectories [B, M, T, 2]`` (metres, points at ``(k+1)·plan_dt``), ``agents [B, N, 10]`` and
``agents_mask [B, N]`` (observation agent tokens), ``ego_state [B, 4]`` -> ``logits [B, M]``,
``probs [B, M]`` (sigmoid of the logits, both from one evaluation as for the discriminator).

Architecture (about 64k parameters with the defaults; ``CriticConfig``):

- one query token per trajectory point, from the point, its velocity, its time and the ego state;
- for every (point, agent) pair of the ``max_agents`` nearest agents a key built from where the agent
  is relative to that point: its observed position, its position extrapolated at constant velocity
  to the point's time, relative and closing velocity, heading, size and class. The observation has no
  agent futures, so the critic is given both the "agent stays" and the "agent keeps going" hypotheses
  and learns from the simulator's labels where the logged agents really end up;
- ``num_blocks`` x (each point attends to its agents, :class:`AgentAttention`, with a learned null
  key so an empty scene stays defined; then self-attention along the trajectory's points);
- a max- and mean-pool over the points (a collision at any time counts) and an MLP head -> one logit.

The map is not an input: the labels are collisions with logged agents, and the map would mainly tell
where an agent turns or merges, which a few thousand labelled decisions hardly teach; without it one
call for M = 32 candidates costs a few milliseconds on the CPU (a (point, agent) grid of 32 x 8 x 16).

Checkpoint directory: ``config.json`` (``{"format_version", "kind": "collision_critic", "model":
CriticConfig, "training": {...}}``) and ``critic.safetensors``; :func:`ensure_critic_onnx` exports
``onnx/critic.onnx`` beside it (dynamic B, M and N) and re-exports when the weights change.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rad2_core.config import writable_dir
from safetensors.torch import load_file, save_file
from torch import nn

from rad2_planner.networks.layers import MLP, Linear, TransformerLayer, mask_to_bias

FORMAT_VERSION = 1
KIND = "collision_critic"
CRITIC_INPUTS = ("trajectories", "agents", "agents_mask", "ego_state")
CRITIC_OUTPUTS = ("logits", "probs")
# Bump when the exported graph changes for the same weights (a cached onnx/critic.onnx is refreshed).
# 2: the TorchScript-tracing exporter (runtime/onnx_export.py).
CRITIC_EXPORT_FORMAT = 2
from rad2_planner.runtime.onnx_export import EXPORTER as ONNX_EXPORTER  # noqa: E402
from rad2_planner.runtime.onnx_export import OPSET as ONNX_OPSET  # noqa: E402

PAIR_FEATURES = 16  # per (trajectory point, agent) pair, see CollisionCritic._pair_features


class CriticCheckpointError(RuntimeError):
    """A critic checkpoint directory is missing, incomplete or does not fit its config."""


@dataclass
class CriticConfig:
    """Sizes and scalings of the critic, saved as JSON with its weights."""

    plan_points: int = 8  # T, trajectory points per candidate
    plan_dt: float = 0.5  # s between trajectory points
    horizon_s: float = 4.0  # k: the label is "collides within horizon_s"
    d_model: int = 48
    num_heads: int = 4
    mlp_ratio: int = 2
    num_blocks: int = 2
    max_agents: int = 16  # nearest agent tokens the critic looks at
    position_scale_m: float = 20.0  # positions are divided by it (O(1) inside the planning range)
    speed_scale_m_s: float = 10.0  # velocities are divided by it
    ego_state_scale: list[float] = field(default_factory=lambda: [0.1, 0.5, 2.0, 2.0])
    agent_dim: int = 10

    def __post_init__(self):
        checks = (
            ("plan_points", self.plan_points >= 1),
            ("plan_dt", self.plan_dt > 0),
            ("horizon_s", 0 < self.horizon_s <= self.plan_points * self.plan_dt + 1e-9),
            ("d_model", self.d_model >= 4 and self.d_model % self.num_heads == 0),
            ("num_heads", self.num_heads >= 1),
            ("mlp_ratio", self.mlp_ratio >= 1),
            ("num_blocks", self.num_blocks >= 1),
            ("max_agents", self.max_agents >= 1),
            ("position_scale_m", self.position_scale_m > 0),
            ("speed_scale_m_s", self.speed_scale_m_s > 0),
            ("ego_state_scale", len(self.ego_state_scale) == 4),
            ("agent_dim", self.agent_dim == 10),
        )
        for name, ok in checks:
            if not ok:
                raise ValueError(
                    f"CriticConfig.{name}: invalid value {getattr(self, name)!r} ({self._why(name)})"
                )

    def _why(self, name: str) -> str:
        return {
            "horizon_s": f"must be in (0, plan_points x plan_dt = {self.plan_points * self.plan_dt:g}] s",
            "d_model": f"must be >= 4 and divisible by num_heads={self.num_heads}",
            "ego_state_scale": "needs 4 entries (speed, accel, yaw rate, steering)",
            "agent_dim": "agent tokens have 10 features",
        }.get(name, "must be positive")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CriticConfig:
        unknown = set(d) - set(cls.__dataclass_fields__)
        if unknown:
            raise CriticCheckpointError(f"critic config has unknown fields {sorted(unknown)}")
        return cls(**d)


class AgentAttention(nn.Module):
    """Each trajectory point attends to the agents (multi-head, with a learned null key).

    The key of a (point, agent) pair is the embedding of their relative geometry (``pair``), so the
    query enters additively: ``score = w·GELU(pair + W q)``, value from the same hidden vector. On the
    [B·M·T, N] pair grid this is one matrix product per block instead of the separate query/key/value
    projections and per-row ``QKᵀ`` of dot-product attention, which cost ONNX Runtime several times
    more on these small shapes. The null key (score ``null_score``, value ``null_value``) keeps a
    point without agents defined and lets every point attend to "nothing relevant"."""

    def __init__(self, d: int, heads: int):
        super().__init__()
        self.h, self.dh = heads, d // heads
        self.q = Linear(d, d)
        self.score_value = Linear(d, heads + d)
        self.null_score = nn.Parameter(torch.zeros(heads))
        self.null_value = nn.Parameter(torch.zeros(d))
        self.out = Linear(d, d)
        self.norm = nn.LayerNorm(d)

    def forward(self, q: torch.Tensor, pair: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        """q [B, M, T, D], pair [B, M, T, N, D], bias [B, 1, 1, N, 1] additive -> q updated [B, M, T, D]."""
        b, m, t, n, d = pair.shape
        hidden = nn.functional.gelu(pair + self.q(self.norm(q))[:, :, :, None, :])
        sv = self.score_value(hidden)  # B M T N (h + D)
        score = sv[..., : self.h] + bias  # B M T N h
        value = sv[..., self.h :].reshape(b, m, t, n, self.h, self.dh)
        # softmax over the N agents and the null key together, written out so the null key needs no
        # concatenation onto the pair grid
        top = torch.maximum(score.max(dim=3).values, self.null_score)  # B M T h
        e = torch.exp(score - top[:, :, :, None, :])
        e_null = torch.exp(self.null_score - top)  # B M T h
        num = (e[..., None] * value).sum(dim=3) + e_null[..., None] * self.null_value.view(self.h, self.dh)
        agg = num / (e.sum(dim=3) + e_null)[..., None]  # B M T h dh
        return q + self.out(agg.reshape(b, m, t, d))


class CollisionCritic(nn.Module):
    def __init__(self, cfg: CriticConfig | None = None):
        super().__init__()
        self.cfg = cfg = cfg or CriticConfig()
        d = cfg.d_model
        times = (torch.arange(cfg.plan_points, dtype=torch.float32) + 1.0) * cfg.plan_dt
        self.register_buffer("times", times)  # [T] s
        self.register_buffer("ego_scale", torch.tensor(cfg.ego_state_scale, dtype=torch.float32))
        self.query_mlp = MLP(5 + 4, d, d)
        self.pair_mlp = MLP(PAIR_FEATURES, d, d)
        self.time_pos = nn.Parameter(torch.zeros(1, cfg.plan_points, d))
        nn.init.normal_(self.time_pos, std=0.02)
        self.agent_attention = nn.ModuleList(AgentAttention(d, cfg.num_heads) for _ in range(cfg.num_blocks))
        self.temporal = nn.ModuleList(
            TransformerLayer(d, cfg.num_heads, cfg.mlp_ratio) for _ in range(cfg.num_blocks)
        )
        self.norm = nn.LayerNorm(2 * d)
        self.head = nn.Sequential(Linear(2 * d, d), nn.GELU(), Linear(d, 1))

    def _pair_features(self, traj: torch.Tensor, vel: torch.Tensor, agents: torch.Tensor) -> torch.Tensor:
        """[B, M, T, N, PAIR_FEATURES] of every (trajectory point, agent) pair, scaled to O(1)."""
        ps, vs = self.cfg.position_scale_m, self.cfg.speed_scale_m_s
        p = traj[:, :, :, None, :]  # B M T 1 2
        v = vel[:, :, :, None, :]
        a = agents[:, None, None, :, :]  # B 1 1 N 10
        t = self.times.view(1, 1, -1, 1, 1)
        a_xy, a_v = a[..., 0:2], a[..., 4:6]
        rel_now = a_xy - p  # agent where it was observed
        rel_cv = a_xy + a_v * t - p  # agent extrapolated at constant velocity to the point's time
        dist_now = torch.sqrt((rel_now * rel_now).sum(-1, keepdim=True) + 1e-6)
        dist_cv = torch.sqrt((rel_cv * rel_cv).sum(-1, keepdim=True) + 1e-6)
        rel_v = a_v - v
        closing = -(rel_cv * rel_v).sum(-1, keepdim=True) / dist_cv  # > 0: the gap is shrinking
        shape = rel_cv.shape[:-1] + (1,)
        feats = [
            rel_now / ps,
            rel_cv / ps,
            rel_v / vs,
            closing / vs,
            torch.log1p(dist_now),
            torch.log1p(dist_cv),
            a[..., 2:4].expand(*shape[:-1], 2),  # agent heading cos, sin
            a[..., 6:7].expand(shape) * 0.2,
            a[..., 7:8].expand(shape) * 0.5,  # length, width
            a[..., 8:10].expand(*shape[:-1], 2),  # is_vehicle, is_vru
            (t / self.cfg.horizon_s).expand(shape),
        ]
        return torch.cat(feats, dim=-1)

    def logits(
        self,
        trajectories: torch.Tensor,
        agents: torch.Tensor,
        agents_mask: torch.Tensor,
        ego_state: torch.Tensor,
    ) -> torch.Tensor:
        """trajectories [B, M, T, 2] ego-frame metres -> logits [B, M] (collision within horizon_s)."""
        # agent tokens come nearest first (rad2_core.tokens.agent_tokens): the far ones cannot be
        # reached within the horizon and only cost time on the pair grid
        agents = agents[:, : self.cfg.max_agents]
        agents_mask = agents_mask[:, : self.cfg.max_agents]
        b, m, t, _ = trajectories.shape
        d = self.cfg.d_model
        prev = torch.cat([torch.zeros_like(trajectories[:, :, :1]), trajectories[:, :, :-1]], dim=2)
        vel = (trajectories - prev) / self.cfg.plan_dt
        tt = (self.times / self.cfg.horizon_s).view(1, 1, -1, 1).expand(b, m, t, 1)
        es = (ego_state * self.ego_scale)[:, None, None, :].expand(b, m, t, 4)
        q_feats = torch.cat(
            [trajectories / self.cfg.position_scale_m, vel / self.cfg.speed_scale_m_s, tt, es], dim=-1
        )
        q = self.query_mlp(q_feats) + self.time_pos[:, None]  # B M T D
        pair = self.pair_mlp(self._pair_features(trajectories, vel, agents))  # B M T N D
        bias = mask_to_bias(agents_mask)[:, None, None, :, None]  # B 1 1 N 1
        for attend, temporal in zip(self.agent_attention, self.temporal):
            q = attend(q, pair, bias)
            q = temporal(q.reshape(b * m, t, d)).reshape(b, m, t, d)
        pooled = torch.cat([q.max(dim=2).values, q.mean(dim=2)], dim=-1)  # a hit at any time counts
        return self.head(self.norm(pooled))[..., 0]

    def forward(self, trajectories, agents, agents_mask, ego_state) -> tuple[torch.Tensor, torch.Tensor]:
        """``(logits, probs)`` [B, M] of one evaluation (the exported graph's two outputs)."""
        logits = self.logits(trajectories, agents, agents_mask, ego_state)
        return logits, torch.sigmoid(logits)

    # -- checkpoint -----------------------------------------------------------------------------------
    def save(self, directory: str | Path, training: dict[str, Any] | None = None) -> Path:
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        sd = {k: v.detach().contiguous().cpu() for k, v in self.state_dict().items()}
        save_file(sd, str(d / "critic.safetensors"))
        meta = {
            "format_version": FORMAT_VERSION,
            "kind": KIND,
            "model": self.cfg.to_dict(),
            "training": training or {},
        }
        tmp = d / ".config.json.tmp"
        tmp.write_text(json.dumps(meta, indent=1))
        tmp.replace(d / "config.json")
        return d

    @classmethod
    def load(cls, directory: str | Path) -> CollisionCritic:
        d = Path(directory)
        cfg_path, w_path = d / "config.json", d / "critic.safetensors"
        for p in (cfg_path, w_path):
            if not p.is_file():
                raise CriticCheckpointError(
                    f"critic checkpoint {d}: no {p.name} (train one with rad2 train critic)"
                )
        try:
            meta = json.loads(cfg_path.read_text())
        except ValueError as exc:
            raise CriticCheckpointError(f"{cfg_path}: unreadable JSON ({exc})") from exc
        if meta.get("kind") != KIND or meta.get("format_version") != FORMAT_VERSION:
            raise CriticCheckpointError(
                f"{cfg_path}: kind {meta.get('kind')!r} / format_version {meta.get('format_version')!r} "
                f"is not a collision critic of format {FORMAT_VERSION}"
            )
        critic = cls(CriticConfig.from_dict(meta["model"]))
        try:
            critic.load_state_dict(load_file(str(w_path)))
        except Exception as exc:  # noqa: BLE001 -- safetensors and load_state_dict raise their own kinds
            raise CriticCheckpointError(f"{w_path}: weights do not fit config.json ({exc})") from exc
        critic.training_info = meta.get("training", {})
        critic.checkpoint_dir = d
        return critic.eval()

    def weights_hash(self) -> str:
        h = hashlib.sha256(json.dumps(self.cfg.to_dict(), sort_keys=True).encode())
        for k, v in sorted(self.state_dict().items()):
            h.update(k.encode())
            h.update(v.detach().cpu().contiguous().numpy().tobytes())
        return h.hexdigest()

    @property
    def num_parameters(self) -> int:
        return int(sum(p.numel() for p in self.parameters()))


# ----------------------------------------------------------------------------------------------------
# ONNX export


def critic_example_inputs(
    cfg: CriticConfig, batch: int = 2, m: int = 3, n: int = 5, seed: int = 0
) -> dict[str, np.ndarray]:
    """Random inputs of the graph's shapes (B, M, N > 1 so the exporter keeps them dynamic)."""
    rng = np.random.default_rng(seed)
    traj = np.cumsum(rng.uniform(0.0, 6.0, (batch, m, cfg.plan_points, 2)) * [1.0, 0.2], axis=2)
    agents = np.zeros((batch, n, 10))
    agents[..., :2] = rng.normal(0.0, 15.0, (batch, n, 2))
    yaw = rng.uniform(-np.pi, np.pi, (batch, n))
    agents[..., 2], agents[..., 3] = np.cos(yaw), np.sin(yaw)
    agents[..., 4:6] = rng.normal(0.0, 5.0, (batch, n, 2))
    agents[..., 6], agents[..., 7] = rng.uniform(0.5, 5.0, (batch, n)), rng.uniform(0.5, 2.2, (batch, n))
    agents[..., 8] = 1.0
    mask = rng.random((batch, n)) < 0.7
    mask[:, 0] = True
    ego = rng.random((batch, 4)) * [15.0, 1.0, 0.1, 0.05]
    return {
        "trajectories": traj.astype(np.float32),
        "agents": agents.astype(np.float32),
        "agents_mask": mask,
        "ego_state": ego.astype(np.float32),
    }


def export_critic_onnx(critic: CollisionCritic, path: str | Path) -> Path:
    """Export ``critic`` (the planner's exporter, opset 18; dynamic batch, candidates, agents) to ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    critic = critic.to("cpu").eval()
    ex = critic_example_inputs(critic.cfg)
    args = tuple(torch.from_numpy(ex[k]) for k in CRITIC_INPUTS)
    b, m, n = "batch", "candidates", "agents"
    dyn = {
        "trajectories": {0: b, 1: m},
        "agents": {0: b, 1: n},
        "agents_mask": {0: b, 1: n},
        "ego_state": {0: b},
    }
    from rad2_planner.runtime.onnx_export import _export  # the one exporter, atomic write

    _export(critic, args, CRITIC_INPUTS, CRITIC_OUTPUTS, dyn, path)
    return path


def ensure_critic_onnx(critic: CollisionCritic, out_dir: str | Path) -> Path:
    """``out_dir/critic.onnx`` of exactly these weights (exported unless the manifest matches)."""
    out = Path(out_dir)
    path, man = out / "critic.onnx", out / "critic_manifest.json"
    want = {"weights_hash": critic.weights_hash(), "export_format": CRITIC_EXPORT_FORMAT}
    if path.is_file() and man.is_file():
        try:
            meta = json.loads(man.read_text())
        except ValueError:
            meta = {}
        if all(meta.get(k) == v for k, v in want.items()):
            return path
    if (cache := writable_dir(out)) != out:  # an installed, read-only checkpoint: the user's cache
        return ensure_critic_onnx(critic, cache)
    export_critic_onnx(critic, path)
    tmp = out / f".critic_manifest.{os.getpid()}.tmp"
    tmp.write_text(
        json.dumps(
            {
                **want,
                "exporter": ONNX_EXPORTER,
                "opset": ONNX_OPSET,
                "inputs": CRITIC_INPUTS,
                "outputs": CRITIC_OUTPUTS,
                "torch": torch.__version__,
            },
            indent=1,
        )
    )
    os.replace(tmp, man)
    return path


# ----------------------------------------------------------------------------------------------------
# runtime


class CriticRunner:
    """The critic behind the planner's backend choice: ``pytorch`` runs the module, ``onnxruntime`` the
    exported graph (CPU). ``openvino`` and ``tensorrt`` planners run the critic in ONNX Runtime too: a
    graph this small costs well under a millisecond there and needs no engine build."""

    def __init__(
        self,
        critic: CollisionCritic,
        backend: str,
        runtime_params: dict[str, Any],
        onnx_dir: str | Path | None = None,
    ):
        """``runtime_params``: the ``runtime`` block of params/planner.yaml as loaded (the ONNX Runtime
        session settings)."""
        self.critic = critic.eval()
        self.cfg = critic.cfg
        self.backend = "pytorch" if backend == "pytorch" else "onnxruntime"
        self.session = None
        if self.backend == "onnxruntime":
            import onnxruntime as ort

            from rad2_planner.runtime.ort_backend import _session_options

            ckpt = getattr(critic, "checkpoint_dir", None)
            if onnx_dir is None and ckpt is None:
                raise ValueError("CriticRunner: a critic built in memory needs onnx_dir for its ONNX export")
            path = ensure_critic_onnx(critic, onnx_dir if onnx_dir is not None else Path(ckpt) / "onnx")
            self.session = ort.InferenceSession(
                str(path), _session_options(ort, runtime_params), providers=["CPUExecutionProvider"]
            )

    def __call__(
        self, trajectories: np.ndarray, agents: np.ndarray, agents_mask: np.ndarray, ego_state: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """``(logits, probs)`` float32 [B, M] for batched NumPy inputs (shapes as :data:`CRITIC_INPUTS`)."""
        traj = np.ascontiguousarray(trajectories, dtype=np.float32)
        if traj.ndim != 4 or traj.shape[2:] != (self.cfg.plan_points, 2):
            raise ValueError(
                f"trajectories: shape {traj.shape}, expected [B, M, {self.cfg.plan_points}, 2] "
                "(the critic's plan_points)"
            )
        feed = {
            "trajectories": traj,
            "agents": np.ascontiguousarray(agents, dtype=np.float32),
            "agents_mask": np.ascontiguousarray(agents_mask, dtype=bool),
            "ego_state": np.ascontiguousarray(ego_state, dtype=np.float32),
        }
        if feed["agents"].shape[0] != traj.shape[0] or feed["ego_state"].shape != (traj.shape[0], 4):
            raise ValueError(
                f"agents {feed['agents'].shape} / ego_state {feed['ego_state'].shape}: batch "
                f"does not match trajectories' B={traj.shape[0]}"
            )
        if self.session is not None:
            logits, probs = self.session.run(list(CRITIC_OUTPUTS), feed)
            return logits, probs
        with torch.inference_mode():
            logits, probs = self.critic(*(torch.from_numpy(feed[k]) for k in CRITIC_INPUTS))
        return logits.numpy(), probs.numpy()
