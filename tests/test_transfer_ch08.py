"""Chapter 8's transfer exercise, ch08-speculative: the model solution
passes, the usual wrong solutions fail with the feedback that names their
mistake, and the reference (course_lib.generation.speculative, tested in
tests/test_speculative.py) makes the emitted token follow p."""
import pytest
import torch

from course_lib.generation import speculative
from course_lib.notebook.function_exercise import DiagnosedFunctionExercise

from notebook_support import exercise_cell, run_exercise_cell, model_solution

MARKER = "DiagnosedFunctionExercise(\n"


@pytest.fixture(scope="module")
def spec():
    source = exercise_cell("ch08_sampling.ipynb", "ch08-speculative")
    assert source.count(MARKER) == 1
    ns = {"torch": torch, "speculative": speculative,
          "DiagnosedFunctionExercise": DiagnosedFunctionExercise}
    run_exercise_cell(source, ns)
    ex = ns["EXERCISE"]
    solution = model_solution(ex)
    return ex, solution


def test_reference_lives_in_the_library(spec):
    ex, _ = spec
    assert ex.reference is speculative.speculative_acceptance
    assert ex.purpose == "transfer"
    assert 3 <= len(ex.cases) <= 6


def test_cases_emit_p(spec):
    """On every case, accept and residual rebuild p: q(x) a(x) for the
    drafted token plus the rejection mass times the residual."""
    ex, _ = spec
    for (p, q, _), _ in ex.cases:
        V = p.shape[-1]
        out = torch.zeros_like(p)
        for x in range(V):
            draft = torch.full(p.shape[:-1], x, dtype=torch.long)
            if (q[..., x] == 0).any():
                continue
            a, r = speculative.speculative_acceptance(p, q, draft)
            out[..., x] += q[..., x] * a
            out += (q[..., x] * (1 - a))[..., None] * r
        torch.testing.assert_close(out, p)


def test_model_solution_passes(spec):
    ex, solution = spec
    assert ex.check(solution).correct


def wrong(body):
    """A wrong solution as a function object (checked in this process)."""
    ns = {"torch": torch}
    exec("def accept_or_resample(p, q, draft):\n"
         "    idx = draft[..., None]\n"
         "    p_x = p.gather(-1, idx)[..., 0]\n"
         "    q_x = q.gather(-1, idx)[..., 0]\n" + body, ns)
    return ns["accept_or_resample"]


@pytest.mark.parametrize("body,needle", [
    ("    excess = torch.clamp(p - q, min=0)\n"
     "    return p_x / q_x, excess / excess.sum(-1, keepdim=True)\n",
     "above 1"),
    ("    return torch.clamp(p_x / q_x, max=1), p.clone()\n",
     "from $p$ itself"),
    ("    excess = torch.clamp(q - p, min=0)\n"
     "    mass = excess.sum(-1, keepdim=True)\n"
     "    return (torch.clamp(p_x / q_x, max=1),\n"
     "            torch.where(mass > 0, excess / mass, p))\n",
     "$\\max(0, q - p)$"),
])
def test_usual_mistakes_fail_with_feedback(spec, body, needle):
    ex, _ = spec
    feedback = ex.check(wrong(body))
    assert not feedback.correct
    assert "Traceback" not in feedback.message
    assert needle in feedback.message, feedback.message
