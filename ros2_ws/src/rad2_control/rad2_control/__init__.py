"""Trajectory tracking: kinematic bicycle model, batched iLQR and plan-to-reference conversion.

``TrackingController`` is the entry point (simulator, controller node, benchmark); see
``bicycle.py`` (model, analytic Jacobians), ``ilqr.py`` (solver) and ``reference.py`` (references).
"""

from rad2_core.bicycle import VehicleParams, VehicleParamsError

from rad2_control.ilqr import ControllerParamsError, CostWeights, ILQRSettings, SolveReport
from rad2_control.reference import Reference, ReferenceError, build_reference, shift_controls
from rad2_control.tracker import TrackingController, TrackingSolution

__all__ = [
    "ControllerParamsError",
    "CostWeights",
    "ILQRSettings",
    "Reference",
    "ReferenceError",
    "SolveReport",
    "TrackingController",
    "TrackingSolution",
    "VehicleParams",
    "VehicleParamsError",
    "build_reference",
    "shift_controls",
]
