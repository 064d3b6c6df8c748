"""Chapter 13's transfer exercise, checked from outside the notebook.

``ch13-q4-1-quantize`` asks for the Q4_1 round trip (quantize, then
decode), the step the chapter only ran in reverse. The cell is read from
the notebook and run; the model solution must pass, the usual mistakes
must fail with feedback that names them, and the reference
(``requantize.q4_1_roundtrip``) must decode, block by block, to what the
chapter's one-block decoder reads from ``gguf.quants``' Q4_1 bytes.
"""
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import quantize

from course_lib.notebook.function_exercise import DiagnosedFunctionExercise
from course_lib.pretrained import requantize
from course_lib.pretrained.gguf_file import dequantize_q4_1_block
from course_lib.pretrained.requantize import q4_0_roundtrip

from notebook_support import (
    assert_mistake_caught, exercise_cell, learner_function, model_solution,
    run_exercise_cell)



@pytest.fixture(scope="module")
def q41_exercise():
    ns = {"torch": torch, "requantize": requantize,
          "q4_0_roundtrip": q4_0_roundtrip,
          "DiagnosedFunctionExercise": DiagnosedFunctionExercise}
    source = exercise_cell("ch13_real_model.ipynb", "ch13-q4-1-quantize")
    run_exercise_cell(source, ns)
    exercise = ns["EXERCISE"]
    solution = model_solution(exercise)
    return exercise, solution


def test_exercise_is_a_transfer_with_a_library_reference(q41_exercise):
    exercise, _ = q41_exercise
    assert exercise.purpose == "transfer"
    assert exercise.reference is requantize.q4_1_roundtrip
    shapes = [tuple(args[0].shape) for args, _ in exercise.cases]
    assert (32,) in shapes and any(len(s) == 3 for s in shapes)


def test_solution_passes(q41_exercise):
    exercise, solution = q41_exercise
    assert exercise.check(solution).correct              # in the sandbox


@pytest.mark.parametrize("old,new,named", [
    ("/ 15", "/ 16", "divided by 16"),
    ("inv + 0.5)", "inv)", "truncated"),
    ("d.half().float() * q + m.half().float()", "d * q + m",
     "stayed in float32"),
    ("torch.where(d == 0, 0.0, 1 / d)", "1 / d", "equal weights"),
    ("d.half().float() * q + m.half().float()", "d.half().float() * q",
     None),
])
def test_usual_mistakes_fail_with_feedback(q41_exercise, old, new, named):
    exercise, solution = q41_exercise
    assert old in solution
    wrong = learner_function(exercise, solution.replace(old, new))
    assert_mistake_caught(exercise, wrong, named)


def test_reference_decodes_like_the_chapters_block_decoder():
    """Quantized by gguf.quants and read back by dequantize_q4_1_block,
    block by block, the bytes decode to q4_1_roundtrip's weights."""
    w = 0.7 * torch.randn(3, 64, generator=torch.Generator()
                          .manual_seed(6)) + 0.2
    w[1, :32] = -0.4                                     # a block with d = 0
    raw = quantize(w.numpy(), GGMLQuantizationType.Q4_1).reshape(-1, 20)
    decoded = torch.stack([dequantize_q4_1_block(b) for b in raw])
    assert torch.equal(decoded.reshape(w.shape),
                       requantize.q4_1_roundtrip(w))
