"""Chapter 7's transfer exercise, ch07-smoothed-loss: the model solution
passes, the usual wrong solutions fail with the feedback that names their
mistake, and the library reference agrees with PyTorch's label smoothing
(tests/test_training_losses.py has the reference's own tests)."""
import math

import pytest
import torch
import torch.nn.functional as F

from course_lib import training
from course_lib.notebook.function_exercise import DiagnosedFunctionExercise

from notebook_support import exercise_cell, run_exercise_cell, model_solution

MARKER = "DiagnosedFunctionExercise(\n"


@pytest.fixture(scope="module")
def smoothed():
    source = exercise_cell("ch07_training.ipynb", "ch07-smoothed-loss")
    assert source.count(MARKER) == 1
    ns = {"torch": torch, "F": F, "math": math, "training": training,
          "DiagnosedFunctionExercise": DiagnosedFunctionExercise}
    run_exercise_cell(source, ns)
    ex = ns["EXERCISE"]
    solution = model_solution(ex)
    return ex, solution


def test_reference_lives_in_the_library(smoothed):
    ex, _ = smoothed
    assert ex.reference is training.label_smoothed_loss
    assert ex.purpose == "transfer"
    assert 3 <= len(ex.cases) <= 6


def test_reference_is_pytorch_with_rescaled_eps(smoothed):
    ex, _ = smoothed
    for (logits, targets, eps), _ in ex.cases:
        V = logits.shape[-1]
        if eps * V / (V - 1) > 1:
            continue
        expected = F.cross_entropy(
            logits.flatten(0, 1).double(), targets.flatten(),
            ignore_index=training.IGNORE,
            label_smoothing=eps * V / (V - 1)).item()
        assert training.label_smoothed_loss(logits, targets, eps) == \
            pytest.approx(expected, rel=1e-9)


def test_model_solution_passes(smoothed):
    ex, solution = smoothed
    assert ex.check(solution).correct


def wrong(body):
    """A wrong solution as a function object (checked in this process,
    which is faster than the sandbox that checks typed code)."""
    ns = {"torch": torch, "F": F, "IGNORE": training.IGNORE}
    exec("def smoothed_loss(logits, targets, eps):\n" + body, ns)
    return ns["smoothed_loss"]


@pytest.mark.parametrize("body,needle", [
    ("    return F.cross_entropy(logits.flatten(0, 1), targets.flatten(),\n"
     "        ignore_index=IGNORE, label_smoothing=eps).item()\n",
     "PyTorch's `label_smoothing`"),
    ("    y = targets.clamp(min=0)\n"
     "    log_q = logits.double().log_softmax(-1)\n"
     "    V = logits.shape[-1]\n"
     "    w = torch.full_like(log_q, eps / (V - 1))\n"
     "    w.scatter_(-1, y[..., None], 1 - eps)\n"
     "    return -(w * log_q).sum(-1).mean().item()\n",
     "`IGNORE`"),
    ("    keep = targets != IGNORE\n"
     "    z, y = logits[keep], targets[keep]\n"
     "    q = z.exp() / z.exp().sum(-1, keepdim=True)\n"
     "    V = z.shape[-1]\n"
     "    w = torch.full_like(q, eps / (V - 1))\n"
     "    w.scatter_(-1, y[:, None], 1 - eps)\n"
     "    return -(w * q.log()).sum(-1).mean().item()\n",
     "nan"),
])
def test_usual_mistakes_fail_with_feedback(smoothed, body, needle):
    ex, _ = smoothed
    feedback = ex.check(wrong(body))
    assert not feedback.correct
    assert "Traceback" not in feedback.message
    assert needle in feedback.message, feedback.message
