"""Function exercises defined in the chapters, checked from outside.

A chapter's exercise cell holds test cases and a model solution, and
passes a reference from the library. These tests read that cell from the
notebook and check that (1) the reference agrees with the library class
it teaches,
(2) the model solution passes the checker, and (3) the usual wrong
answers do not. Chapter 11's DeepSeek-V3 gates so far.
"""

import pytest
import torch

from course_lib.notebook.function_exercise import FunctionExercise
from course_lib.model.routing import DeepSeekV3Router, deepseek_v3_gates

from notebook_support import exercise_cell, learner_function


@pytest.fixture(scope="module")
def v3_exercise():
    ns = {"torch": torch, "FunctionExercise": FunctionExercise,
          "deepseek_v3_gates": deepseek_v3_gates}
    source = exercise_cell("ch11_moe.ipynb", "ch11-v3-gates")
    exec(source.replace("FunctionExercise(\n", "EXERCISE = FunctionExercise(\n",
                        1), ns)
    solution = ns["EXERCISE"].solution.split("```python\n")[1].split("```")[0]
    assert "\ndef v3_gates" not in source    # the reference is the library's
    assert ns["EXERCISE"].reference is deepseek_v3_gates
    return deepseek_v3_gates, ns["EXERCISE"], solution


def test_reference_is_the_v3_router(v3_exercise):
    v3_gates, _, _ = v3_exercise
    torch.manual_seed(0)
    router = DeepSeekV3Router(16, 8, 2, n_group=4, topk_group=2,
                              routed_scaling_factor=2.5)
    router.e_score_correction_bias.copy_(0.3 * torch.randn(8))
    u = torch.randn(32, 16)
    r = router(u)
    expected = torch.zeros(32, 8).scatter(1, r.indices, r.weights)
    got = v3_gates(r.scores, router.e_score_correction_bias, 2, 4, 2, 2.5)
    torch.testing.assert_close(got, expected)


def test_solution_passes(v3_exercise):
    _, exercise, solution = v3_exercise
    assert exercise.check(solution).correct


@pytest.mark.parametrize("old,new", [
    ("g = s.gather(-1, idx)", "g = choice.gather(-1, idx)"),   # biased gates
    ("idx = choice.masked_fill(~mask, float('-inf'))", "idx = choice"),
    ("g = g / g.sum(-1, keepdim=True) * scale", "g = g * scale"),
    ("g = g / g.sum(-1, keepdim=True) * scale",
     "g = g / g.sum(-1, keepdim=True)"),
    ("groups.topk(min(2, E // n_group), -1)", "groups.topk(1, -1)"),
    ("choice = s + bias", "choice = s"),
])
def test_usual_mistakes_fail_with_feedback(v3_exercise, old, new):
    _, exercise, solution = v3_exercise
    assert old in solution
    feedback = exercise.check(learner_function(exercise,
                                               solution.replace(old, new)))
    assert not feedback.correct
    assert "expected" in feedback.message and "Traceback" not in \
        feedback.message
