"""Chapter 6's transfer exercise: attention with QK-norm
(`ch06-qk-norm`), checked against qk_norm.qk_norm_attention, which is
RMSNorm (the chapter's block.RMSNorm) then ordinary attention."""
import math

import pytest
import torch

from course_lib.model import block, qk_norm
from course_lib.model.attention import scaled_dot_product_attention
from course_lib.model.masks import causal_mask
from course_lib.notebook.function_exercise import DiagnosedFunctionExercise

from notebook_support import (
    exercise_cell, learner_function, model_solution, run_exercise_cell)

MARKER = "DiagnosedFunctionExercise(\n"


@pytest.fixture(scope="module")
def qk_exercise():
    source = exercise_cell("ch06_transformer_block.ipynb", "ch06-qk-norm")
    assert source.count(MARKER) == 1
    ns = {"torch": torch, "math": math, "qk_norm": qk_norm,
          "causal_mask": causal_mask,
          "DiagnosedFunctionExercise": DiagnosedFunctionExercise}
    run_exercise_cell(source, ns)
    ex = ns["EXERCISE"]
    solution = model_solution(ex)
    return ex, solution


def test_cases_and_reference(qk_exercise):
    ex, _ = qk_exercise
    assert ex.reference is qk_norm.qk_norm_attention
    assert ex.purpose == "transfer"
    args = [a for a, _ in ex.cases]
    assert any(a[5] is None for a in args) and any(a[5] is not None
                                                   for a in args)
    assert any(a[0].shape[2] < a[1].shape[2] for a in args)
    assert any(a[0].shape[-1] == 1 for a in args)
    assert any(a[0].abs().max() > 50 for a in args)


def test_reference_is_rmsnorm_modules_then_attention(qk_exercise):
    ex, _ = qk_exercise
    for (q, k, v, g_q, g_k, mask), kw in ex.cases:
        d = q.shape[-1]
        norm_q = block.RMSNorm(d, eps=kw["eps"]).double()
        norm_k = block.RMSNorm(d, eps=kw["eps"]).double()
        with torch.no_grad():
            norm_q.weight.copy_(g_q)
            norm_k.weight.copy_(g_k)
            want, _ = scaled_dot_product_attention(norm_q(q), norm_k(k), v,
                                                   mask)
        torch.testing.assert_close(ex.reference(q, k, v, g_q, g_k, mask,
                                                **kw), want)


def test_solution_passes(qk_exercise):
    ex, solution = qk_exercise
    assert ex.check(solution).correct



WRONG = [       # (replacements, words of the hint)
    ({"x.pow(2).mean(-1, keepdim=True)": "x.pow(2).mean(-2, keepdim=True)"},
     "positions"),
    ({"k_hat = rms_norm(k, k_weight)": "k_hat = k"}, "only the queries"),
    ({" / math.sqrt(q.shape[-1])": ""}, "sqrt{d_k}"),
]


@pytest.mark.parametrize("n", range(len(WRONG)))
def test_usual_mistakes_fail_with_their_hint(qk_exercise, n):
    """The first as learner source (in the sandbox), the others as
    functions (in process: the same checker, faster)."""
    ex, solution = qk_exercise
    edits, needle = WRONG[n]
    wrong = solution
    for old, new in edits.items():
        assert old in wrong
        wrong = wrong.replace(old, new)
    feedback = ex.check(wrong if n == 0 else learner_function(ex, wrong))
    assert not feedback.correct
    assert "Likely mistake" in feedback.message, feedback.message
    assert needle in feedback.message, feedback.message
