"""Runtime backends (PyTorch, ONNX Runtime, TensorRT) behind one interface, and the ONNX export."""

from rad2_planner.runtime.base import BACKENDS, Backend, BackendUnavailableError, make_backend

__all__ = ["BACKENDS", "Backend", "BackendUnavailableError", "make_backend"]
