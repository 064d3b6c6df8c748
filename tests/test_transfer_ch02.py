"""Chapter 2's transfer exercise, ALiBi's bias (``ch02-alibi-bias``): the
model solution passes, the usual wrong biases fail with feedback naming
the mistake, and the reference is the library's ``alibi.alibi_bias``,
whose unit tests (tests/test_alibi.py) compare it with the paper's code."""
import pytest
import torch

from course_lib.model import alibi
from course_lib.notebook.function_exercise import DiagnosedFunctionExercise

from notebook_support import (
    exercise_cell, learner_function, model_solution, run_exercise_cell)



@pytest.fixture(scope="module")
def exercise():
    ns = {"torch": torch, "alibi": alibi,
          "DiagnosedFunctionExercise": DiagnosedFunctionExercise}
    source = exercise_cell("ch02_positional_encoding.ipynb", "ch02-alibi-bias")
    run_exercise_cell(source, ns)
    ex = ns["EXERCISE"]
    return ex, model_solution(ex)


def test_is_a_transfer_with_the_library_reference(exercise):
    ex, _ = exercise
    assert ex.purpose == "transfer" and ex.reference is alibi.alibi_bias
    heads = {args[0] for args, _ in ex.cases}
    assert {1, 8} <= heads and any(h != 8 for h in heads)


def test_reference_is_the_papers_bias_for_eight_heads():
    b = alibi.alibi_bias(8, 4)
    assert b[0, 3, 0].item() == -1.5 and b[7, 3, 0].item() == -3 / 256
    assert torch.isinf(b[:, 0, 1]).all()


def test_solution_passes(exercise):
    ex, solution = exercise
    assert ex.check(solution).correct


@pytest.mark.parametrize("old,new,named", [
    ("bias.masked_fill(dist < 0, float(\"-inf\"))",
     "-slopes[:, None, None] * dist.abs()", "causal model"),
    ("bias = -slopes", "bias = slopes", "wrong sign"),
    ("torch.arange(1, n_heads + 1,", "torch.arange(0, n_heads,",
     "numbered from"),
    ("2.0 ** (-8.0 * h / n_heads)", "2.0 ** (-h)", "agree only for"),
])
def test_usual_mistakes_are_named(exercise, old, new, named):
    ex, solution = exercise
    assert old in solution
    feedback = ex.check(learner_function(ex, solution.replace(old, new)))
    assert not feedback.correct
    assert named in feedback.message, feedback.message


def test_float64_result_is_named(exercise):
    ex, solution = exercise
    wrong = solution.replace("dtype=torch.float32", "dtype=torch.float64")
    feedback = ex.check(learner_function(ex, wrong))
    assert not feedback.correct and "float64" in feedback.message
