"""The machine a figure was measured on: CPU model, logical CPUs, load, Python (no ROS, no networks).

Kept apart from the benchmarks so that training and evaluation reports record the same facts."""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np


@dataclass(frozen=True)
class MachineInfo:
    cpu_model: str
    logical_cpus: int
    python: str
    numpy_blas: str

    def describe(self) -> str:
        return f"{self.cpu_model}, {self.logical_cpus} logical CPUs, Python {self.python}"


def machine_info() -> MachineInfo:
    model = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    try:
        blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]["name"]  # numpy >= 1.26
    except Exception:  # noqa: BLE001 -- informational only
        blas = "?"
    return MachineInfo(model, os.cpu_count() or 1, platform.python_version(), str(blas))


def hardware_record() -> dict[str, Any]:
    """What figures were measured on, as a JSON-able dict (CPU model, logical CPUs, the three load
    averages now, Python, platform): the record training and evaluation reports keep."""
    info = machine_info()
    return {
        "cpu": info.cpu_model,
        "logical_cpus": info.logical_cpus,
        "load_average": list(os.getloadavg()),
        "python": info.python,
        "platform": platform.platform(),
    }


def load_average() -> float:
    """1-minute load average (NaN where the OS has none)."""
    try:
        return float(os.getloadavg()[0])
    except (AttributeError, OSError):
        return float("nan")
