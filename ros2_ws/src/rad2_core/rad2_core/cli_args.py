"""What the verbs of the ``rad2`` command share about bad input: argparse value types for their options,
and ``run_tool`` for the inputs found bad later (a dataset, a checkpoint). A bad value is an argparse
error (exit 2, "argument --cycles: must be an integer >= 1, got '0'"), never a traceback or a silent
default.

    ap.add_argument("--cycles", type=int_at_least(1), default=200)
    ap.add_argument("--budget-min", type=float_in(0.0, exclusive_min=True))
    ap.add_argument("--k", type=schema_value("planner", "planner.num_denoise_steps"))
    ...
    run_tool(lambda: verb.main(argv), "rad2 bench planner")   # what rad2_bringup.cli.main does
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable


def _bounds(lo: float | None, hi: float | None, exclusive_min: bool) -> str:
    def text(v: float) -> str:
        return str(v) if isinstance(v, int) else f"{v:g}"

    parts = []
    if lo is not None:
        parts.append(f"> {text(lo)}" if exclusive_min else f">= {text(lo)}")
    if hi is not None:
        parts.append(f"<= {text(hi)}")
    return " and ".join(parts)


def int_at_least(lo: int, hi: int | None = None) -> Callable[[str], int]:
    """An integer in [lo, hi] (hi None: no upper bound)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < lo or (hi is not None and value > hi):
            raise argparse.ArgumentTypeError(f"must be an integer {_bounds(lo, hi, False)}, got {text!r}")
        return value

    parse.__name__ = "integer"  # argparse names the type in its own messages
    return parse


def float_in(lo: float | None = None, hi: float | None = None, *, exclusive_min: bool = False
             ) -> Callable[[str], float]:
    """A finite float within the bounds (``exclusive_min``: strictly above ``lo``)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        ok = math.isfinite(value)
        if ok and lo is not None:
            ok = value > lo if exclusive_min else value >= lo
        if ok and hi is not None:
            ok = value <= hi
        if not ok:
            bounds = _bounds(lo, hi, exclusive_min)
            raise argparse.ArgumentTypeError(
                f"must be a finite number{' ' + bounds if bounds else ''}, got {text!r}")
        return value

    parse.__name__ = "number"
    return parse


def schema_value(params_name: str, dotted: str) -> Callable[[str], object]:
    """A command-line override of one parameter of ``params/<params_name>.yaml``, parsed as its schema's
    type and checked against its bounds and choices (the schema beside the file is the one source
    of truth: ``--k 0`` fails as ``planner.num_denoise_steps`` would in the file)."""
    from rad2_core.config import load_schema, value_problem

    spec = load_schema(params_name)[dotted]

    def parse(text: str) -> object:
        value: object = text
        if spec.type in ("int", "float"):
            try:
                value = int(text) if spec.type == "int" else float(text)
            except ValueError:
                raise argparse.ArgumentTypeError(f"{dotted} is {spec.type}, got {text!r}") from None
        problem = value_problem(spec, value)
        if problem:
            raise argparse.ArgumentTypeError(f"{dotted} = {text!r} {problem}")
        return value

    parse.__name__ = dotted
    return parse


def schema_choices(params_name: str, dotted: str) -> list:
    """The ``choices`` of one parameter of ``params/<params_name>.schema.yaml``, for an option's
    argparse ``choices=`` (the schema is their one list; the parameter must be an enumeration)."""
    from rad2_core.config import load_schema

    choices = load_schema(params_name)[dotted].choices
    if choices is None:
        raise ValueError(f"{dotted} of params/{params_name}.schema.yaml lists no choices")
    return list(choices)


def torch_device(text: str) -> str:
    """A torch device of this project's backends: cpu, cuda or cuda:<index>."""
    if re.fullmatch(r"cpu|cuda(:\d+)?", text):
        return text
    raise argparse.ArgumentTypeError(f"must be cpu, cuda or cuda:<index>, got {text!r}")


# Errors that mean "this input cannot be used" (a dataset, a checkpoint, a parameter, a backend that
# is not here), by module and class name: a tool's message, not a traceback. Checked through
# sys.modules so that a tool that never imported torch does not import it to report a bad path.
_INPUT_ERRORS = (
    ("rad2_core.storage", "ClipFormatError"),
    ("rad2_core.field_checks", "ClipValidationError"),
    ("bev_warp_sim.state", "SimulationError"),
    ("rad2_core.config", "ParameterError"),
    ("rad2_planner.networks.model", "CheckpointError"),
    ("rad2_planner.networks.critic", "CriticCheckpointError"),
    ("rad2_planner.runtime.base", "BackendUnavailableError"),
)


def run_tool(main: Callable[[], int | None], prog: str) -> int:
    """``main()``'s exit code; an input error (see ``_INPUT_ERRORS``) prints ``<prog>: error: <why>``
    to stderr and gives 2, as argparse does for a bad option."""
    import sys

    try:
        return int(main() or 0)
    except Exception as e:  # noqa: BLE001 - re-raised unless it is one of the input errors
        kinds = tuple(getattr(sys.modules[mod], name) for mod, name in _INPUT_ERRORS if mod in sys.modules)
        if not isinstance(e, kinds):
            raise
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
