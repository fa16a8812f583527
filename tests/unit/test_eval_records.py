"""What evaluation keeps and draws: clip checks before the first rollout (bev_warp_sim.preflight), the
episode log a resumed run reads back (rad2_evaluation.episode_log), the episode GIF with its candidates
and the per-split summary figure (rad2_evaluation.closed_loop)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
from bev_warp_sim.metrics import EpisodeResult
from bev_warp_sim.preflight import RefusedClipsError, check_split, check_splits
from bev_warp_sim.simulator import Simulator
from rad2_core.config import load_merged
from rad2_core.storage import load_dataset, save_dataset

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def params():
    return load_merged()


@pytest.fixture(scope="module")
def clips():
    return load_dataset(ROOT / "data" / "eval_safety")[:2]


def _result(clip_id: str, collided: bool = False, rho: float = 0.9, score: float = 0.8) -> EpisodeResult:
    return EpisodeResult(clip_id=clip_id, scenario_kind="cut_in", start_step=0, end_step=10, num_steps=10,
                         termination="collision" if collided else "clip_end", collided=collided,
                         at_fault=collided, offroad=False, min_ttc=0.0 if collided else 3.0, rho=rho,
                         ego_progress_m=9.0, expert_progress_m=10.0, comfort_violation_rate=0.1,
                         comfort_any=True, r_coll=-1.0 if collided else 0.0, r_eff=rho, plan_r1=0.5,
                         score=score)


def test_check_split_names_every_refused_clip_with_its_reason(clips, params, tmp_path):
    speed = clips[1].ego_speed.copy()
    speed[7] = 900.0
    save_dataset([clips[0], dataclasses.replace(clips[1], ego_speed=speed)], tmp_path / "ds")
    # a clip file that does not load is refused by its index entry, not raised at load time
    index = json.loads((tmp_path / "ds" / "index.json").read_text())
    index["clips"].append({**index["clips"][0], "clip_id": "broken", "file": "clips/broken.npz"})
    (tmp_path / "ds" / "index.json").write_text(json.dumps(index))
    (tmp_path / "ds" / "clips" / "broken.npz").write_bytes(b"not a zip")
    sim = Simulator(params)
    checked = check_split(tmp_path / "ds", sim)
    assert [c.clip_id for c in checked.clips] == [clips[0].clip_id] and checked.positions == [0]
    reasons = {r.clip_id: r.reason for r in checked.refused}
    assert "ego_speed[7] = 900" in reasons[clips[1].clip_id]
    assert "does not load" in reasons["broken"]
    with pytest.raises(RefusedClipsError) as err:
        check_splits([tmp_path / "ds"], sim)
    assert clips[1].clip_id in str(err.value) and "broken" in str(err.value)
    assert len(check_splits([tmp_path / "ds"], sim, skip_bad=True)[0].refused) == 2


def test_episode_log_reads_back_exactly_cuts_a_torn_line_and_names_changed_settings(tmp_path):
    from rad2_evaluation.episode_log import EpisodeLog, SettingsMismatch

    first = _result("a", rho=0.123456789012345)
    with EpisodeLog(tmp_path) as log:
        log.use_settings("idm", {"sim": {"dt": 0.1}, "h_reuse": 1})
        log.add("idm", "data/x", 0, "a#1", first)
        log.flush()
    with (tmp_path / "episodes.jsonl").open("a") as f:
        f.write('{"run": "idm", "split": "da')  # killed while writing the next line
    log = EpisodeLog(tmp_path, resume=True)
    (key, back), = log.done("idm", "data/x", 0).items()
    assert key == "a#1" and json.dumps(back.as_dict()) == json.dumps(first.as_dict())  # NaN fields too
    log.add("idm", "data/x", 0, "b#2", _result("b"))
    log.close()
    assert set(EpisodeLog(tmp_path, resume=True).done("idm", "data/x", 0)) == {"a#1", "b#2"}
    with pytest.raises(SettingsMismatch, match=r"sim\.dt: was 0\.1, now 0\.2"):
        EpisodeLog(tmp_path, resume=True).use_settings("idm", {"sim": {"dt": 0.2}, "h_reuse": 1})


def _decisions(n_steps: int, m: int = 6, t: int = 8):
    from rad2_evaluation.episode_log import DecisionView

    rng = np.random.default_rng(0)
    out = []
    for step in range(0, n_steps, 2):
        cand = np.cumsum(np.abs(rng.normal(2.0, 0.5, (m, t, 2))) * [1.0, 0.1], axis=1).astype(np.float32)
        logits = rng.normal(0.0, 3.0, m).astype(np.float32)
        out.append(DecisionView(step, np.zeros(3), int(np.argmax(logits)), cand[int(np.argmax(logits))], cand,
                                1 / (1 + np.exp(-logits)), logits, 0.5))
    return out


def test_episode_gif_is_wide_enough_to_show_lanes_and_records_round_trip(clips, tmp_path):
    import imageio.v2 as imageio
    from rad2_evaluation.closed_loop import GIF_WIDTH_PX, render_episode_gif
    from rad2_evaluation.episode_log import EpisodeLog, EpisodeRecord

    clip = clips[0]
    n = 6
    track = np.column_stack([clip.ego_x[:n], clip.ego_y[:n], clip.ego_yaw[:n], clip.ego_speed[:n],
                             np.zeros(n), clip.ego_accel[:n]])
    decisions = [dataclasses.replace(d, pose=track[d.step, :3]) for d in _decisions(n)]
    with EpisodeLog(tmp_path / "run") as log:  # what a resumed run renders from
        log.save_record("rad2", "data/eval_safety", 0, clip.clip_id, EpisodeRecord(track, None, decisions))
        back = log.load_record("rad2", "data/eval_safety", 0, clip.clip_id)
    assert len(back.decisions) == len(decisions)
    for a, b in zip(back.decisions, decisions):
        assert np.array_equal(a.candidates, b.candidates) and np.array_equal(a.logits, b.logits)
        assert a.selected == b.selected and a.plan_dt == b.plan_dt
    path = render_episode_gif(clip, back.track, _result(clip.clip_id), tmp_path / "ep.gif", stride=2,
                              decisions=back.decisions, label="rad2")
    frames = list(imageio.get_reader(path))
    assert len(frames) == 3
    assert all(f.shape[1] >= 800 for f in frames) and frames[0].shape[1] == GIF_WIDTH_PX
    # the candidates change the picture: a render without them differs
    plain = list(imageio.get_reader(render_episode_gif(clip, track, _result(clip.clip_id),
                                                       tmp_path / "plain.gif", stride=2)))
    assert not np.array_equal(frames[1], plain[1])


def test_split_summary_figure_is_written(tmp_path):
    from bev_warp_sim.preflight import RefusedClip
    from rad2_evaluation.closed_loop import SplitEvaluation, plot_split_summary

    evals = [SplitEvaluation(p, "data/eval_safety", {}, [_result("a", collided=(p == "idm")), _result("b")],
                             skipped=[RefusedClip("data/eval_safety", "c", "route doubles back")])
             for p in ("idm", "rad2")]
    path = plot_split_summary(evals, tmp_path / "summary_eval_safety.png")
    assert path.is_file() and path.stat().st_size > 10_000
