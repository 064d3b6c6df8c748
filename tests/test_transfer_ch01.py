"""Chapter 1's transfer exercise, the GRU forward pass (``ch01-gru-forward``):
the model solution passes, the usual wrong GRUs fail with feedback naming
the mistake, and the reference (``rnn.gru_forward``) is ``torch.nn.GRU``.
Also the ``ch01-rnn-forward`` exercise, whose reference is the library's
``rnn.rnn_forward``."""
import pytest
import torch

from course_lib.experiments import rnn
from course_lib.notebook.function_exercise import (DiagnosedFunctionExercise,
                                                   FunctionExercise)

from notebook_support import (
    exercise_cell, learner_function, model_solution, run_exercise_cell)

NOTEBOOK = "ch01_rnn_limits.ipynb"



def _exercise(key, constructor):
    ns = {"torch": torch, "rnn": rnn, "FunctionExercise": FunctionExercise,
          "DiagnosedFunctionExercise": DiagnosedFunctionExercise}
    source = exercise_cell(NOTEBOOK, key)
    run_exercise_cell(source, ns)
    exercise = ns["EXERCISE"]
    solution = model_solution(exercise)
    return exercise, solution


@pytest.fixture(scope="module")
def gru():
    return _exercise("ch01-gru-forward", "DiagnosedFunctionExercise")


def test_gru_is_a_transfer_with_the_library_reference(gru):
    exercise, _ = gru
    assert exercise.purpose == "transfer"
    assert exercise.reference is rnn.gru_forward
    assert len(exercise.cases) >= 3


def test_gru_reference_is_torch_gru(gru):
    exercise, _ = gru
    (x, w_ih, w_hh, b_ih, b_hh), _ = exercise.cases[1]
    ref = torch.nn.GRU(x.shape[-1], w_hh.shape[1], batch_first=True)
    with torch.no_grad():
        for name, value in [("weight_ih_l0", w_ih), ("weight_hh_l0", w_hh),
                            ("bias_ih_l0", b_ih), ("bias_hh_l0", b_hh)]:
            getattr(ref, name).copy_(value)
        torch.testing.assert_close(rnn.gru_forward(x, w_ih, w_hh, b_ih,
                                                   b_hh), ref(x)[0])


def test_gru_solution_passes(gru):
    exercise, solution = gru
    assert exercise.check(solution).correct


@pytest.mark.parametrize("old,new,named", [
    ("h = (1 - z) * n + z * h", "h = z * n + (1 - z) * h", "swapped"),
    ("i_r, i_z, i_n = (x[:, t] @ weight_ih.T + bias_ih).split(d_h, -1)\n"
     "        h_r, h_z, h_n =",
     "i_z, i_r, i_n = (x[:, t] @ weight_ih.T + bias_ih).split(d_h, -1)\n"
     "        h_z, h_r, h_n =", "reset and update"),
    ("n = torch.tanh(i_n + r * h_n)",
     "n = torch.tanh(i_n + (r * h) @ weight_hh[2 * d_h:].T"
     " + bias_hh[2 * d_h:])", "paper"),
    ("n = torch.tanh(i_n + r * h_n)",
     "n = torch.tanh(i_n + r * (h_n - bias_hh[2 * d_h:]) + bias_hh[2 * d_h:])",
     "bias included"),
])
def test_gru_usual_mistakes_are_named(gru, old, new, named):
    exercise, solution = gru
    assert old in solution
    feedback = exercise.check(learner_function(exercise,
                                               solution.replace(old, new)))
    assert not feedback.correct
    assert named in feedback.message, feedback.message


def test_gru_without_reset_gate_fails(gru):
    exercise, solution = gru
    feedback = exercise.check(learner_function(
        exercise, solution.replace("r * h_n", "h_n")))
    assert not feedback.correct and "Case" in feedback.message


def test_rnn_forward_uses_the_library_reference():
    exercise, solution = _exercise("ch01-rnn-forward", "FunctionExercise")
    assert exercise.reference is rnn.rnn_forward
    assert exercise.check(solution).correct
    assert not exercise.check(learner_function(
        exercise, solution.replace("torch.tanh(", "("))).correct
