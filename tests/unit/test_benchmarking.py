"""The reproducibility record of every benchmark (rad2_evaluation.benchmarking): the matrix-product probe
behind the FLOP floors."""

from __future__ import annotations

import pytest
from rad2_evaluation import benchmarking


def test_the_floor_is_taken_from_the_fastest_matrix_product_library(monkeypatch):
    """Both CPU kernel libraries are probed (their speed depends on the CPU vendor: MKL ran at half of
    ONNX Runtime's MLAS on an AMD EPYC), and the floor uses the faster one, so that a slow library cannot
    make a cycle look closer to its floor than it is."""
    import torch

    probes = benchmarking.matmul_probes(1, size=128, seconds=0.05)
    expected = {"torch", "onnxruntime"} | ({"onednn"} if torch.backends.mkldnn.is_available() else set())
    assert set(probes) == expected and all(g > 0 for g in probes.values())

    monkeypatch.setattr(benchmarking, "matmul_probes", lambda *a, **k: {"torch": 180.0, "onnxruntime": 400.0})
    assert benchmarking.matmul_probe(2) == 400.0
    ctx = benchmarking.RunContext.start(2)
    assert ctx.probe_gflops == 400.0 and ctx.probe_by_library == {"torch": 180.0, "onnxruntime": 400.0}
    assert ctx.floor_ms(1.6e9) == pytest.approx(4.0)
    assert "best of torch 180, onnxruntime 400 GFLOP/s" in ctx.finish().header()
    assert benchmarking.RunContext.start(2, probe=False).probe_by_library is None
