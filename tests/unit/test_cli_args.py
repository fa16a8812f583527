"""The tools' value types (rad2_core.cli_args): bad values are argparse errors that name the option
and the value, bounds of parameters come from their schema, input errors are messages, not tracebacks."""

from __future__ import annotations

import argparse

import pytest
from rad2_core.cli_args import float_in, int_at_least, run_tool, schema_value, torch_device


def _parse(type_, text):
    ap = argparse.ArgumentParser(prog="t", exit_on_error=False)
    ap.add_argument("--x", type=type_)
    return ap.parse_args([f"--x={text}"]).x


@pytest.mark.parametrize("type_,good,bad", [
    (int_at_least(1), [("1", 1), ("40", 40)], ["0", "-3", "1.5", "nan", "x"]),
    (int_at_least(0, 232), [("0", 0), ("232", 232)], ["233", "-1"]),
    (float_in(0.5, 100.0), [("0.5", 0.5), ("1e2", 100.0)], ["0.49", "nan", "inf", "1e12", "-inf"]),
    (float_in(0.0, exclusive_min=True), [("1e-9", 1e-9)], ["0", "-1", "nan"]),
    (schema_value("planner", "planner.num_denoise_steps"), [("1", 1), ("100", 100)], ["0", "101", "2.0"]),
    (schema_value("planner", "planner.sampler"), [("ddim", "ddim")], ["euler", ""]),
    (schema_value("sim", "node.realtime_factor"), [("0.01", 0.01)], ["0", "1e6", "nan"]),
    (torch_device, [("cpu", "cpu"), ("cuda", "cuda"), ("cuda:1", "cuda:1")],
     ["gpu", "cuda:", "cuda:x", "-1"]),
])
def test_values_within_bounds_parse_and_others_name_the_value(type_, good, bad):
    for text, want in good:
        assert _parse(type_, text) == want
    for text in bad:
        with pytest.raises(argparse.ArgumentError, match=repr(text).replace("(", r"\(")):
            _parse(type_, text)


def test_run_tool_reports_input_errors_and_reraises_the_rest(capsys):
    from rad2_core.config import ParameterError
    from rad2_core.storage import iter_dataset

    def bad_dataset():
        next(iter_dataset("nowhere_dataset"))

    assert run_tool(bad_dataset, "tool") == 2
    assert "tool: error: nowhere_dataset" in capsys.readouterr().err

    def bad_parameter():
        raise ParameterError("planner.deadline_ms = -1 is below its minimum 1.0")

    assert run_tool(bad_parameter, "tool") == 2
    assert run_tool(lambda: None, "tool") == 0 and run_tool(lambda: 3, "tool") == 3
    with pytest.raises(ZeroDivisionError):  # a defect keeps its traceback
        run_tool(lambda: 1 / 0, "tool")
