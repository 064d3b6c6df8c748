"""Chapter 11's transfer exercise, expert-choice routing, checked from
outside: the model solution passes, the usual mistakes fail with the
feedback that names them, and the reference is the library's."""
import pytest
import torch

from course_lib.model.routing import expert_choice_gates
from course_lib.notebook.function_exercise import DiagnosedFunctionExercise

from notebook_support import exercise_cell, run_exercise_cell, model_solution


@pytest.fixture(scope="module")
def exercise():
    ns = {"torch": torch, "expert_choice_gates": expert_choice_gates,
          "DiagnosedFunctionExercise": DiagnosedFunctionExercise}
    source = exercise_cell("ch11_moe.ipynb", "ch11-expert-choice")
    assert "\ndef expert_choice_gates" not in source
    run_exercise_cell(source, ns)
    ex = ns["EXERCISE"]
    assert ex.reference is expert_choice_gates and ex.purpose == "transfer"
    return ex


def solution(ex):
    return model_solution(ex)


def test_solution_passes(exercise):
    fb = exercise.check(solution(exercise))
    assert fb.correct, fb.message


@pytest.mark.parametrize("old,new,names", [
    ("topk(capacity, dim=-2).indices    # (..., C, E)\n"
     "    chosen = torch.zeros_like(probs, dtype=torch.bool).scatter(-2",
     "topk(capacity, dim=-1).indices\n"
     "    chosen = torch.zeros_like(probs, dtype=torch.bool).scatter(-1",
     "each *token*"),
    ("return torch.where(chosen, probs, torch.zeros_like(probs))",
     "g = torch.where(chosen, probs, torch.zeros_like(probs))\n"
     "    return g / g.sum(-2, keepdim=True)", "renormalised"),
    ("return torch.where(chosen, probs, torch.zeros_like(probs))",
     "return chosen", "mask of the chosen pairs"),
])
def test_usual_mistakes_fail_with_their_feedback(exercise, old, new, names):
    code = solution(exercise)
    assert old in code
    fb = exercise.check(code.replace(old, new))
    assert not fb.correct and names in fb.message, fb.message
    assert "Traceback" not in fb.message


def test_mixed_groups_are_named():
    """Flattening the groups is right on a single group and wrong on the
    cases with leading dimensions (checked in the kernel: no child)."""
    gen = torch.Generator().manual_seed(0)
    probs = torch.rand(2, 6, 3, generator=gen).softmax(-1)
    flat = expert_choice_gates(probs.reshape(-1, 3), 2).reshape(probs.shape)
    assert not torch.equal(flat, expert_choice_gates(probs, 2))
