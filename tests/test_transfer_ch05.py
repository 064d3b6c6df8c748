"""Chapter 5's transfer exercise: GQA by grouping the query heads
(`ch05-gqa-groups`), checked against mha.grouped_query_attention, which
is MultiHeadAttention's own computation."""
import math

import pytest
import torch

from course_lib.model.masks import causal_mask
from course_lib.model.mha import MultiHeadAttention, grouped_query_attention
from course_lib.notebook.function_exercise import DiagnosedFunctionExercise

from notebook_support import (
    exercise_cell, learner_function, model_solution, run_exercise_cell)

MARKER = "DiagnosedFunctionExercise(\n"


@pytest.fixture(scope="module")
def gqa_exercise():
    source = exercise_cell("ch05_multi_head_attention.ipynb",
                           "ch05-gqa-groups")
    assert source.count(MARKER) == 1
    ns = {"torch": torch, "math": math, "causal_mask": causal_mask,
          "grouped_query_attention": grouped_query_attention,
          "DiagnosedFunctionExercise": DiagnosedFunctionExercise}
    run_exercise_cell(source, ns)
    ex = ns["EXERCISE"]
    solution = model_solution(ex)
    return ex, solution


def test_cases_and_reference(gqa_exercise):
    ex, _ = gqa_exercise
    assert ex.reference is grouped_query_attention
    assert ex.purpose == "transfer"
    groups = {args[0].shape[1] // args[1].shape[1] for args, _ in ex.cases}
    assert {1} < groups and max(groups) == 4         # MHA, GQA and MQA
    assert any(args[1].shape[1] == 1 for args, _ in ex.cases)
    assert any(args[3] is None for args, _ in ex.cases)
    assert any(args[0].shape[2] < args[1].shape[2] for args, _ in ex.cases)


def test_reference_is_the_module():
    """The reference computes what MultiHeadAttention(n_kv_heads=G) does."""
    torch.manual_seed(0)
    layer = MultiHeadAttention(24, 6, n_kv_heads=2, bias=False)
    layer.eval()
    x = torch.randn(2, 5, 24)
    q = layer.q_proj(x).view(2, 5, 6, 4).transpose(1, 2)
    k = layer.k_proj(x).view(2, 5, 2, 4).transpose(1, 2)
    v = layer.v_proj(x).view(2, 5, 2, 4).transpose(1, 2)
    out = grouped_query_attention(q, k, v, causal_mask(5))
    out = layer.o_proj(out.transpose(1, 2).reshape(2, 5, 24))
    torch.testing.assert_close(out, layer(x, causal_mask(5)))


def test_solution_passes(gqa_exercise):
    ex, solution = gqa_exercise
    assert ex.check(solution).correct



WRONG = [       # (replacements, words of the hint)
    ({"q.view(B, G, H // G, T, d_k)": "q.view(B, H // G, G, T, d_k)",
      "k[:, :, None]": "k[:, None]", "v[:, :, None]": "v[:, None]"},
     "i \\bmod G"),
    ({" / math.sqrt(d_k)": ""}, "sqrt{d_k}"),
    ({"if mask is not None:": "if False:"}, "mask was not applied"),
]


@pytest.mark.parametrize("n", range(len(WRONG)))
def test_usual_mistakes_fail_with_their_hint(gqa_exercise, n):
    """The first as learner source (in the sandbox), the others as
    functions (in process: the same checker, faster)."""
    ex, solution = gqa_exercise
    edits, needle = WRONG[n]
    wrong = solution
    for old, new in edits.items():
        assert old in wrong
        wrong = wrong.replace(old, new)
    feedback = ex.check(wrong if n == 0 else learner_function(ex, wrong))
    assert not feedback.correct
    assert "Likely mistake" in feedback.message, feedback.message
    assert needle in feedback.message, feedback.message
