"""Chapter 4's transfer exercise: the end-aligned sliding-window mask
(`ch04-sliding-window`), checked against masks.sliding_window_mask."""
import pytest
import torch

from course_lib.model import masks
from course_lib.notebook.function_exercise import DiagnosedFunctionExercise

from notebook_support import (
    exercise_cell, learner_function, model_solution, run_exercise_cell)

MARKER = "DiagnosedFunctionExercise(\n"


@pytest.fixture(scope="module")
def window_exercise():
    source = exercise_cell("ch04_masking.ipynb", "ch04-sliding-window")
    assert source.count(MARKER) == 1
    ns = {"torch": torch, "masks": masks,
          "DiagnosedFunctionExercise": DiagnosedFunctionExercise}
    run_exercise_cell(source, ns)
    ex = ns["EXERCISE"]
    solution = model_solution(ex)
    return ex, solution


def test_reference_is_the_library_and_cases_cover_the_edges(window_exercise):
    ex, _ = window_exercise
    assert ex.reference is masks.sliding_window_mask
    assert ex.purpose == "transfer"
    shapes = [(args, kw["window"]) for args, kw in ex.cases]
    assert any(q < k for (q, k), _ in shapes)           # a cache
    assert any(q == 1 for (q, _), _ in shapes)          # one new token
    assert any(w == 1 for _, w in shapes)
    assert any(w > k for (_, k), w in shapes)           # window > length


def test_reference_against_a_loop():
    for q_len, k_len, w in [(3, 7, 3), (4, 4, 2), (1, 6, 4), (2, 5, 9)]:
        p0 = k_len - q_len
        want = torch.tensor([[p0 + i - w < j <= p0 + i for j in range(k_len)]
                             for i in range(q_len)])
        assert torch.equal(masks.sliding_window_mask(q_len, k_len, window=w),
                           want)
    # an infinite window is the causal mask
    assert torch.equal(masks.sliding_window_mask(3, 8, window=100),
                       masks.causal_mask(3, 8))


def test_solution_passes(window_exercise):
    ex, solution = window_exercise
    assert ex.check(solution).correct


WRONG = [
    ("    p = torch.arange(q_len)[:, None] + (k_len - q_len)",
     "    p = torch.arange(q_len)[:, None]", "top-left"),
    ("(j > p - window)", "(j >= p - window)", "window + 1"),
    ("(j <= p) & (j > p - window)", "(j <= p)", "causal mask alone"),
    ("(j <= p) & (j > p - window)", "((j - p).abs() < window)", "future"),
]



@pytest.mark.parametrize("old,new,needle", WRONG)
def test_usual_mistakes_fail_with_their_hint(window_exercise, old, new,
                                             needle):
    """The first as learner source (in the sandbox), the others as
    functions (in process: the same checker, faster)."""
    ex, solution = window_exercise
    assert old in solution
    wrong = solution.replace(old, new)
    feedback = ex.check(wrong if (old, new, needle) == WRONG[0]
                        else learner_function(ex, wrong))
    assert not feedback.correct
    assert "Likely mistake" in feedback.message, feedback.message
    assert needle in feedback.message, feedback.message
