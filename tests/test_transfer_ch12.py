"""Chapter 12's transfer exercise, total and active parameters of MoE
configurations the chapter never printed, checked from outside: the
model solution passes, the usual mistakes fail with the feedback that
names them, and the reference is the library's count (tested against
``transformers`` in tests/test_total_and_active.py)."""
import pytest

from course_lib.notebook.function_exercise import DiagnosedFunctionExercise
from course_lib.sizing import params
from course_lib.sizing.configs import MIXTRAL_8X7B

from notebook_support import (
    exercise_cell, learner_function, model_solution, run_exercise_cell)


@pytest.fixture(scope="module")
def namespace():
    ns = {"params": params,
          "DiagnosedFunctionExercise": DiagnosedFunctionExercise}
    source = exercise_cell("ch12_parameter_counting.ipynb",
                           "ch12-active-params")
    run_exercise_cell(source, ns)
    ex = ns["EXERCISE"]
    assert ex.reference is params.total_and_active
    assert ex.purpose == "transfer"
    return ns


def solution(ex):
    return model_solution(ex)


def test_solution_passes(namespace):
    ex = namespace["EXERCISE"]
    fb = ex.check(solution(ex))
    assert fb.correct, fb.message


def test_cases_are_the_published_configurations(namespace):
    assert params.total_and_active(namespace["QWEN3_30B_A3B"]) == (
        30_532_122_624, 3_353_032_704)
    assert params.total_and_active(namespace["OLMOE_1B_7B"]) == (
        6_919_161_856, 1_282_017_280)


def test_the_solution_agrees_with_count_parameters_on_mixtral(namespace):
    ns = {}
    exec(solution(namespace["EXERCISE"]), ns)
    m = MIXTRAL_8X7B
    fields = dict(vocab_size=m.vocab_size, hidden_size=m.hidden_size,
                  num_hidden_layers=m.num_hidden_layers,
                  num_attention_heads=m.num_attention_heads,
                  num_key_value_heads=m.num_key_value_heads, head_dim=128,
                  intermediate_size=0, first_k_dense_replace=0,
                  n_routed_experts=8, num_experts_per_tok=2,
                  n_shared_experts=0, moe_intermediate_size=14336,
                  tie_word_embeddings=False, qk_norm=None)
    n = params.count_parameters(m)
    assert ns["active_params"](fields) == (n.total, n.active)


@pytest.mark.parametrize("old,new,names", [
    ("c['head_dim']", "D // c['num_attention_heads']", "`head_dim`"),
    ("'head': 2 * d, 'full': (H + G) * d", "'head': 0, 'full': 0",
     "QK-norms are missing"),
    ("active = total - n_moe * (E - k) * expert",
     "active = total - n_moe * (E - k) * expert - V * D",
     "left out the embedding"),
    ("head = 0 if c['tie_word_embeddings'] else V * D", "head = V * D",
     "count it once"),
])
def test_usual_mistakes_fail_with_their_feedback(namespace, old, new, names):
    ex = namespace["EXERCISE"]
    code = solution(ex)
    assert old in code
    fb = ex.check(learner_function(ex, code.replace(old, new)))
    assert not fb.correct and names in fb.message, fb.message
    assert "Traceback" not in fb.message
