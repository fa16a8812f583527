"""An install copied away from the checkout is self-contained. ``setup.py`` installs the shipped
checkpoints and the demo's evaluation splits into share/rad2_bringup; ``config.resource_path`` resolves a
repository-relative path in the checkout, else in that share (through the ament index), else fails
naming the path and both places; an ONNX export that would go into a read-only checkpoint directory
goes to the user's cache instead (``config.writable_dir``)."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from rad2_core import config
from rad2_core.config import ResourceNotFoundError, resource_path, writable_dir

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = {  # what setup.py installs besides params/ (weights and config only: no onnx/ caches)
    "checkpoints/rad2_rl_real": ("config.json", "generator.safetensors", "discriminator.safetensors"),
    "checkpoints/rad2_rl_real_sym": ("config.json", "generator.safetensors", "discriminator.safetensors"),
    "checkpoints/rad2_rl": ("config.json", "generator.safetensors", "discriminator.safetensors"),
    "checkpoints/rad2_il": ("config.json", "generator.safetensors", "discriminator.safetensors"),
    "checkpoints/rad2_il_rich": ("config.json", "generator.safetensors", "discriminator.safetensors"),
    "checkpoints/rad2_il_real": ("config.json", "generator.safetensors", "discriminator.safetensors"),
    "checkpoints/collision_critic": ("config.json", "critic.safetensors"),
    "checkpoints/self_correction": ("config.json", "generator.safetensors", "discriminator.safetensors"),
}
SPLITS = ("data/eval_real", "data/eval_efficiency", "data/eval_safety")  # installed: demo, evaluation


@pytest.fixture(scope="module")
def prefix(tmp_path_factory) -> Path:
    """An install prefix with rad2_bringup's data files, as a build without --symlink-install makes them."""
    prefix = tmp_path_factory.mktemp("install")
    subprocess.run([sys.executable, "setup.py", "-q", "install_data", "--install-dir", str(prefix)],
                   cwd=ROOT / "ros2_ws" / "src" / "rad2_bringup", check=True, capture_output=True,
                   timeout=120)
    return prefix


def test_setup_installs_the_shipped_checkpoints_and_the_demo_splits(prefix):
    share = prefix / "share" / "rad2_bringup"
    for folder, names in SHIPPED.items():
        assert sorted(p.name for p in (share / folder).iterdir()) == sorted(names), folder
        for name in names:
            assert (share / folder / name).read_bytes() == (ROOT / folder / name).read_bytes()
    for split in SPLITS:
        for pattern in ("index.json", "clips/*.npz", "maps/*.npz"):
            shipped = sorted(p.relative_to(ROOT / split) for p in (ROOT / split).glob(pattern))
            installed = sorted(p.relative_to(share / split) for p in (share / split).glob(pattern))
            assert shipped and installed == shipped, (split, pattern)
    assert not (share / "data" / "train").exists()  # training data stays in the checkout


def test_resource_path_prefers_the_source_tree(prefix, monkeypatch):
    monkeypatch.setenv("AMENT_PREFIX_PATH", str(prefix))  # an install is there too: the checkout wins
    assert resource_path("checkpoints/rad2_il") == ROOT / "checkpoints" / "rad2_il"
    assert resource_path("data/eval_safety") == ROOT / "data" / "eval_safety"
    assert resource_path(ROOT / "nowhere") == ROOT / "nowhere"  # absolute: as it is
    # required=False (outputs, caches): where the checkout's would be
    assert resource_path("checkpoints/rad2_il/none", required=False) == ROOT / "checkpoints/rad2_il/none"


def test_resource_path_falls_back_to_the_installed_share_away_from_the_checkout(prefix, tmp_path):
    """rad2_core.config copied out of the checkout (as an install puts it), run from another working
    directory with only the install on AMENT_PREFIX_PATH: the demo's checkpoint and splits load from
    the share, and a missing resource names both places."""
    site = tmp_path / "site" / "rad2_core"
    site.mkdir(parents=True)
    for name in ("__init__.py", "config.py"):
        shutil.copy(ROOT / "ros2_ws" / "src" / "rad2_core" / "rad2_core" / name, site / name)
    env = {k: v for k, v in os.environ.items() if k not in ("RAD2_PARAMS_DIR", "PYTHONPATH")}
    env.update(PYTHONPATH=str(site.parent), AMENT_PREFIX_PATH=str(prefix))
    work = tmp_path / "elsewhere"
    work.mkdir()
    wanted = [*SHIPPED, *SPLITS]
    code = ("from rad2_core.config import resource_path, ResourceNotFoundError\n"
            f"for p in {wanted!r}:\n"
            "    print(resource_path(p))\n"
            "try:\n"
            "    resource_path('data/train')\n"
            "except ResourceNotFoundError as exc:\n"
            "    print(exc)\n")
    res = subprocess.run([sys.executable, "-c", code], cwd=work, env=env, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.strip().splitlines()
    share = prefix / "share" / "rad2_bringup"
    assert [Path(x) for x in lines[:-1]] == [share / p for p in wanted]
    assert "data/train not found" in lines[-1] and str(share / "data" / "train") in lines[-1]
    assert "source checkout (none: no params/ above" in lines[-1]


def test_a_resource_in_neither_place_names_the_path_and_both_places(tmp_path, monkeypatch):
    empty = tmp_path / "prefix"
    (empty / "share" / "ament_index" / "resource_index" / "packages").mkdir(parents=True)
    (empty / "share" / "ament_index" / "resource_index" / "packages" / "rad2_bringup").touch()
    (empty / "share" / "rad2_bringup").mkdir()
    monkeypatch.setenv("AMENT_PREFIX_PATH", str(empty))
    with pytest.raises(ResourceNotFoundError) as info:
        resource_path("checkpoints/missing_run")
    msg = str(info.value)
    assert msg.startswith("checkpoints/missing_run not found")
    assert str(ROOT / "checkpoints" / "missing_run") in msg
    assert str(empty / "share" / "rad2_bringup" / "checkpoints" / "missing_run") in msg
    assert isinstance(info.value, config.ParameterError)  # the CLIs print ParameterErrors cleanly
    monkeypatch.setenv("AMENT_PREFIX_PATH", "")
    with pytest.raises(ResourceNotFoundError, match="rad2_bringup is not in the ament index"):
        resource_path("checkpoints/missing_run")


# --------------------------------------------------------------------------------------------------
# read-only checkpoint directories: exports go to the user's cache
# --------------------------------------------------------------------------------------------------


def _read_only(monkeypatch, tree: Path) -> None:
    """Make ``tree`` read-only. chmod does not stop root, so where os.access still reports it writable
    (running as root), os.access is made to answer for it as for a read-only mount."""
    for p in [tree, *tree.rglob("*")]:
        p.chmod(p.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
    if os.access(tree, os.W_OK):
        real = os.access

        def access(path, mode, *args, **kwargs):
            inside = Path(path).absolute() == tree or tree in Path(path).absolute().parents
            return False if inside and mode & os.W_OK else real(path, mode, *args, **kwargs)

        monkeypatch.setattr(os, "access", access)


def test_writable_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert writable_dir(tmp_path / "ckpt" / "onnx") == tmp_path / "ckpt" / "onnx"  # created later, writable
    ro = tmp_path / "ro"
    ro.mkdir()
    _read_only(monkeypatch, ro)
    cache = writable_dir(ro / "onnx")
    assert cache.parent == tmp_path / "cache" / "rad2" / "onnx" and cache.is_dir()
    assert writable_dir(ro / "onnx") == cache  # one cache per directory, stable
    assert writable_dir(ro / "other") != cache
    assert writable_dir(ro / "onnx", "tensorrt").parent.name == "tensorrt"


def test_onnx_export_of_a_read_only_checkpoint_goes_to_the_user_cache(tmp_path, monkeypatch):
    from rad2_planner.runtime import onnx_export
    from tiny_models import randomised_model

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    model = randomised_model()
    ckpt = model.save(tmp_path / "installed" / "ckpt")
    _read_only(monkeypatch, tmp_path / "installed")
    paths = onnx_export.ensure_onnx(model, ckpt / "onnx")
    cache = writable_dir(ckpt / "onnx")
    assert cache != ckpt / "onnx" and not (ckpt / "onnx").exists()
    assert all(p.parent == cache and p.is_file() for p in paths.values())
    assert (cache / "manifest.json").is_file()

    def no_export(*_a, **_k):
        raise AssertionError("a current export must be reused")

    monkeypatch.setattr(onnx_export, "export_onnx", no_export)
    assert onnx_export.ensure_onnx(model, ckpt / "onnx") == paths  # the cached export is reused
    # a current export already in the read-only directory (an install that ships one) is used there
    shipped = tmp_path / "shipped"
    shutil.copytree(cache, shipped / "onnx")
    _read_only(monkeypatch, shipped)
    reused = onnx_export.ensure_onnx(model, shipped / "onnx")
    assert all(p.parent == shipped / "onnx" for p in reused.values())
