"""Runtime backends (PyTorch, ONNX Runtime, TensorRT) behind one interface, and the ONNX export."""

from rad2_planner.runtime.base import Backend, BackendUnavailableError, make_backend

__all__ = ["Backend", "BackendUnavailableError", "make_backend"]
