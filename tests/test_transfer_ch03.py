"""Chapter 3's transfer exercise, merging two online-softmax states
(``ch03-merge-states``): the model solution passes, the usual wrong merges
fail with feedback naming the mistake, and the reference
(``online_softmax.merge_states``) gives attention over all the keys."""
import math

import pytest
import torch

from course_lib.model import online_softmax
from course_lib.notebook.function_exercise import DiagnosedFunctionExercise

from notebook_support import (
    exercise_cell, learner_function, model_solution, run_exercise_cell)



@pytest.fixture(scope="module")
def exercise():
    ns = {"torch": torch, "math": math, "online_softmax": online_softmax,
          "DiagnosedFunctionExercise": DiagnosedFunctionExercise}
    source = exercise_cell("ch03_scaled_dot_product_attention.ipynb",
                           "ch03-merge-states")
    run_exercise_cell(source, ns)
    ex = ns["EXERCISE"]
    return ex, model_solution(ex), ns


def test_is_a_transfer_with_the_library_reference(exercise):
    ex, _, _ = exercise
    assert ex.purpose == "transfer"
    assert ex.reference is online_softmax.merge_states
    # the cases include a masked row and scores whose e^m overflows
    assert any(torch.isneginf(args[0]).any() for args, _ in ex.cases)
    assert any((args[3] > 710).any() for args, _ in ex.cases)


def test_reference_merge_is_attention_over_all_keys(exercise):
    _, _, ns = exercise
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, n, 8, dtype=torch.float64)
               for n in (4, 9, 9))
    m, l, o = online_softmax.merge_states(*ns["_state"](q, k[..., :5, :],
                                                        v[..., :5, :]),
                                          *ns["_state"](q, k[..., 5:, :],
                                                        v[..., 5:, :]))
    want = torch.softmax(q @ k.transpose(-2, -1), -1) @ v
    torch.testing.assert_close(o / l, want)


def test_solution_passes(exercise):
    ex, solution, _ = exercise
    assert ex.check(solution).correct


@pytest.mark.parametrize("old,new,named", [
    ("a1 * l1 + a2 * l2, a1 * o1 + a2 * o2", "l1 + l2, o1 + o2",
     "different maxima"),
    ("torch.exp(m1 - m), torch.exp(m2 - m)",
     "torch.exp(m - m1), torch.exp(m - m2)", "upside down"),
    ("torch.exp(m1 - m), torch.exp(m2 - m)", "torch.exp(m1), torch.exp(m2)",
     "overflows"),
])
def test_usual_mistakes_are_named(exercise, old, new, named):
    ex, solution, _ = exercise
    assert old in solution
    feedback = ex.check(learner_function(ex, solution.replace(old, new)))
    assert not feedback.correct
    assert named in feedback.message, feedback.message


def test_returning_the_output_instead_of_the_state_fails(exercise):
    ex, solution, _ = exercise
    wrong = solution.replace("return m, a1 * l1 + a2 * l2, a1 * o1 + a2 * o2",
                             "return (a1 * o1 + a2 * o2) / (a1 * l1 + a2 * l2)")
    feedback = ex.check(learner_function(ex, wrong))
    assert not feedback.correct and "Case 1" in feedback.message
