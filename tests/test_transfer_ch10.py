"""Chapter 10's transfer exercise, FP8 block dequantisation with partial
edge blocks, checked from outside: the model solution passes, the usual
mistakes fail with the feedback that names them, and the reference is
the library's (tested in tests/test_fp8_blocks.py)."""
import math

import pytest
import torch

from course_lib.notebook.function_exercise import DiagnosedFunctionExercise
from course_lib.pretrained.fp8_blocks import (dequantize_fp8_blocks,
                                              quantize_fp8_blocks)

from notebook_support import exercise_cell, run_exercise_cell, model_solution


@pytest.fixture(scope="module")
def exercise():
    ns = {"torch": torch, "math": math,
          "dequantize_fp8_blocks": dequantize_fp8_blocks,
          "quantize_fp8_blocks": quantize_fp8_blocks,
          "DiagnosedFunctionExercise": DiagnosedFunctionExercise}
    source = exercise_cell("ch10_mla.ipynb", "ch10-fp8-dequant")
    assert "\ndef dequantize_fp8_blocks" not in source
    run_exercise_cell(source, ns)
    ex = ns["EXERCISE"]
    assert ex.reference is dequantize_fp8_blocks and ex.purpose == "transfer"
    return ex


def solution(ex):
    return model_solution(ex)


def test_cases_cover_partial_blocks_and_fp8(exercise):
    partial = [args for args, kw in exercise.cases
               if args[0].shape[0] % kw["block"] or
               args[0].shape[1] % kw["block"]]
    assert len(partial) >= 2
    assert all(args[0].dtype == torch.float8_e4m3fn
               for args, _ in exercise.cases)


def test_solution_passes(exercise):
    fb = exercise.check(solution(exercise))
    assert fb.correct, fb.message


@pytest.mark.parametrize("old,new,names", [
    ("full[:R, :C]", "full", "Cut the repeated scale matrix"),
    ("return weight.float() * full[:R, :C]",
     "return weight.float() / full[:R, :C]", "multiplies"),
    ("return weight.float() * full[:R, :C]",
     "return weight * full[:R, :C]", "`.float()`"),
])
def test_usual_mistakes_fail_with_their_feedback(exercise, old, new, names):
    code = solution(exercise)
    assert old in code
    fb = exercise.check(code.replace(old, new))
    assert not fb.correct and names in fb.message, fb.message
    assert "Traceback" not in fb.message


def test_the_chapter_example_is_the_whole_block_case():
    """Chapter 10's cell: w / full to FP8, back with * full; the library
    function gives the same weight from the stored values and scales."""
    torch.manual_seed(0)
    w = torch.randn(256, 384) * 0.02
    scale_inv = w.view(2, 128, 3, 128).abs().amax(dim=(1, 3)) / 448
    full = scale_inv.repeat_interleave(128, 0).repeat_interleave(128, 1)
    w_fp8 = (w / full).to(torch.float8_e4m3fn)
    torch.testing.assert_close(dequantize_fp8_blocks(w_fp8, scale_inv),
                               w_fp8.float() * full)
