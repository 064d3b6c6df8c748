"""Write-a-function exercises that name the usual mistakes: the class
(:mod:`course_lib.notebook.function_exercise`) and the exercises of chapters 6
(RMSNorm) and 7 (bits per token from logits), read from the notebooks as
``tests/test_chapter_exercises.py`` reads chapter 11's.

For each chapter exercise: (1) the reference agrees with an independent
computation (torch's ``rms_norm``, a loop over the targets with Python's
``math``); (2) the model solution passes; (3) each usual mistake, written
as a learner would write it, fails with its own hint; (4) code that
raises, returns junk or the wrong shape gets feedback, never a traceback.
"""
import math

import pytest
import torch
import torch.nn.functional as F

from course_lib.model import block
from course_lib import training
from course_lib.notebook.function_exercise import DiagnosedFunctionExercise

from notebook_support import exercise_cell, learner_function


def load_exercise(notebook: str, key: str, namespace: dict):
    source = exercise_cell(notebook, key)
    marker = "DiagnosedFunctionExercise(\n"
    assert source.count(marker) == 1
    ns = {"torch": torch, "F": F, "math": math,
          "DiagnosedFunctionExercise": DiagnosedFunctionExercise,
          **namespace}
    exec(source.replace(marker, "EXERCISE = " + marker, 1), ns)
    ex = ns["EXERCISE"]
    solution = ex.solution.split("```python\n")[1].split("```")[0]
    return ns, ex, solution


def assert_feedback(feedback, *needles):
    assert not feedback.correct
    assert "Traceback" not in feedback.message
    for needle in needles:
        assert needle in feedback.message, feedback.message


# ------------------------------------------------------------------ class
def test_diagnosis_names_the_mistake_that_reproduces_the_answer():
    ex = DiagnosedFunctionExercise(
        key="t-double",
        purpose="application", prompt="p", func_name="f",
        starter_code="def f(x):\n    ...\n", reference=lambda x: 2 * x,
        cases=[((0,), {}), ((3,), {})], hint="h", solution="s",
        mistakes=[(lambda x: x * x, "squared"),
                  (lambda x: x + 2, "added two"),
                  (lambda x: 1 / x, "divided")])
    # x + 2 is harmless at 0? No: 2 != 0, so case 1 fails and blames it.
    assert_feedback(ex.check(lambda x: x + 2), "Case 1", "added two")
    # x * x equals 2x at 0 (harmless there) and is caught at 3
    assert_feedback(ex.check(lambda x: x * x), "Case 2", "squared")
    # a raising learner is matched by the same exception type
    assert_feedback(ex.check(lambda x: 1 / x), "ZeroDivisionError",
                    "divided")
    fb = ex.check(lambda x: x - 7)                 # nobody's mistake
    assert_feedback(fb, "expected 0, got -7")
    assert "Likely mistake" not in fb.message
    assert ex.check("def f(x):\n    return x + x\n").correct
    assert ex.diagnose((3,), {}, 9) == "squared"
    assert ex.diagnose((3,), {}, 6.5) is None


def test_dtype_must_match_for_floating_tensors():
    ex = DiagnosedFunctionExercise(
        key="t-dtype",
        purpose="application", prompt="p", func_name="f", starter_code="",
        reference=lambda x: x * 2, cases=[((torch.ones(2).half(),), {})],
        hint="h", solution="s",
        mistakes=[(lambda x: x.float() * 2, "cast back")])
    assert_feedback(ex.check(lambda x: x.float() * 2),
                    "expected dtype torch.float16", "cast back")
    assert ex.check(lambda x: x + x).correct


@pytest.mark.parametrize("bad", ["abc", [1], [(1, "h")], [(len, "")],
                                 [(len, "h", 3)]])
def test_mistakes_are_validated(bad):
    with pytest.raises(ValueError, match="mistakes"):
        DiagnosedFunctionExercise(
            key="t-bad",
            purpose="application", prompt="p", func_name="f", starter_code="",
            reference=len, cases=[(("a",), {})], hint="h", solution="s",
            mistakes=bad)


# ------------------------------------------------------ chapter 7: bits
@pytest.fixture(scope="module")
def bits():
    return load_exercise("ch07_training.ipynb", "ch07-bits-per-token",
                         {"training": training})


def loop_bits(logits, targets):
    """Mean -log2 softmax(z)[y] over counted targets, with Python's math."""
    total, n = 0.0, 0
    for row_z, row_y in zip(logits.tolist(), targets.tolist()):
        for z, y in zip(row_z, row_y):
            if y == training.IGNORE:
                continue
            top = max(z)
            lse = top + math.log(sum(math.exp(v - top) for v in z))
            total += lse - z[y]
            n += 1
    return total / n / math.log(2)


def test_bits_reference_equals_a_loop(bits):
    ns, ex, _ = bits
    assert ex.reference is training.bits_per_token
    assert len(ex.cases) >= 5
    for (logits, targets), _ in ex.cases:
        assert ex.reference(logits, targets) == pytest.approx(
            loop_bits(logits, targets), rel=1e-6)
    # the cases cover what the mistakes need: ignored targets, a fully
    # ignored row, logits beyond float32's exp range
    ys = [t for (_, t), _ in ex.cases]
    assert any((y == training.IGNORE).any() for y in ys)
    assert any((y == training.IGNORE).all(-1).any() for y in ys)
    assert any(z.abs().max() > 100 for (z, _), _ in ex.cases)


def test_bits_solution_passes(bits):
    _, ex, solution = bits
    assert ex.check(solution).correct


BITS_MISTAKES = [
    # (old, new, words of the hint)
    ("(-log_q.mean() / math.log(2))", "(-log_q.mean())", "nats"),
    ("(-log_q.mean() / math.log(2))", "(-log_q.sum() / math.log(2))",
     "sum"),
    ("keep = targets != IGNORE", "keep = targets >= -1000", "out of range"),
    ("z, y = logits[keep], targets[keep]",
     "z, y = logits.flatten(0, 1), targets.flatten().clamp(min=0)",
     "were counted"),
    ("torch.logsumexp(z, -1)", "z.exp().sum(-1).log()", "overflows"),
    ("z.gather(-1, y[:, None])[:, 0] - torch.logsumexp(z, -1)",
     "z.softmax(-1).log().gather(-1, y[:, None])[:, 0]", "rounds to 0"),
    (" - torch.logsumexp(z, -1)", "", "not log-probabilities"),
]


@pytest.mark.parametrize("old,new,hint", BITS_MISTAKES)
def test_bits_usual_mistakes_get_their_hint(bits, old, new, hint):
    _, ex, solution = bits
    assert old in solution
    assert_feedback(ex.check(learner_function(ex, solution.replace(old, new))),
                    "Case", "Likely mistake", hint)


def test_bits_wrong_axis_gets_its_hint(bits):
    _, ex, _ = bits
    wrong = ("import math, torch\n"
             "def bits_per_token(logits, targets):\n"
             "    logp = logits.log_softmax(1)\n"
             "    keep = targets != -100\n"
             "    y = targets.clamp(min=0)[..., None]\n"
             "    nll = -logp.gather(-1, y)[..., 0][keep]\n"
             "    return nll.mean().item() / math.log(2)\n")
    assert_feedback(ex.check(wrong), "Likely mistake", "last axis")


def test_bits_count_mistake_gets_its_hint(bits):
    _, ex, _ = bits
    wrong = ("import math, torch\n"
             "def bits_per_token(logits, targets):\n"
             "    keep = targets != -100\n"
             "    y = targets.clamp(min=0)[..., None]\n"
             "    nll = -logits.log_softmax(-1).gather(-1, y)[..., 0]\n"
             "    return (nll * keep).sum().item() / targets.numel() "
             "/ math.log(2)\n")
    assert_feedback(ex.check(wrong), "Likely mistake", "count")


@pytest.mark.parametrize("body,needle", [
    ("raise RuntimeError('boom')", "raised RuntimeError: boom"),
    ("return 'abc'", "expected a number"),
    ("return torch.zeros(2)", "expected a number"),
    ("return float('nan')", "expected a number"),
    ("while True:\n        pass", "did not finish"),
])
def test_bits_broken_code_gets_feedback(bits, body, needle):
    _, ex, _ = bits
    ex.time_limit = 0.5
    code = f"import torch\ndef bits_per_token(logits, targets):\n    {body}\n"
    assert_feedback(ex.check(code), needle)


# --------------------------------------------------- chapter 6: RMSNorm
@pytest.fixture(scope="module")
def rms():
    return load_exercise("ch06_transformer_block.ipynb", "ch06-rms-norm",
                         {"block": block})


def test_rms_reference_equals_torch(rms):
    ns, ex, _ = rms
    assert len(ex.cases) >= 5
    dtypes = set()
    for (x, w, eps), _ in ex.cases:
        dtypes.add(x.dtype)
        got = ex.reference(x, w, eps)
        assert got.dtype == x.dtype
        # torch's rms_norm on float32, cast back: the float32 upcast
        want = F.rms_norm(x.float(), (x.shape[-1],), w.float(), eps)
        torch.testing.assert_close(got.float(), want.to(x.dtype).float(),
                                   rtol=1e-2 if x.dtype != torch.float32
                                   else 1e-6, atol=1e-3)
    assert {torch.float32, torch.float16, torch.bfloat16} <= dtypes
    # the float16 case really overflows without the upcast
    assert any(x.dtype == torch.float16 and
               torch.isinf(x.pow(2)).any() for (x, _, _), _ in ex.cases)
    assert any((x == 0).all(-1).any() for (x, _, _), _ in ex.cases)


def test_rms_solution_passes(rms):
    _, ex, solution = rms
    assert ex.check(solution).correct


RMS_MISTAKES = [
    ("xf.pow(2).mean(-1, keepdim=True)", "xf.mean(-1, keepdim=True)",
     "mean of the squares"),
    ("xf.pow(2).mean(-1, keepdim=True) + eps",
     "xf.pow(2).mean(-1, keepdim=True)", "nan"),
    ("xf.pow(2).mean(-1, keepdim=True)", "xf.pow(2).sum(-1, keepdim=True)",
     "sum"),
    ("xf.pow(2).mean(-1, keepdim=True)", "xf.pow(2).mean(0, keepdim=True)",
     "last axis"),
    ("xf.pow(2).mean(-1, keepdim=True)", "xf.pow(2).mean(-2, keepdim=True)",
     "last axis"),
    (".to(x.dtype) * weight", ".to(x.dtype)", "gain"),
    ("xf = x.float()", "xf = x", "float32"),
    ("(xf * inv_rms).to(x.dtype) * weight", "xf * inv_rms * weight",
     "cast"),
]


@pytest.mark.parametrize("old,new,hint", RMS_MISTAKES)
def test_rms_usual_mistakes_get_their_hint(rms, old, new, hint):
    _, ex, solution = rms
    assert old in solution
    assert_feedback(ex.check(learner_function(ex, solution.replace(old, new))),
                    "Case", "Likely mistake", hint)


def test_rms_layernorm_gets_its_hint(rms):
    _, ex, _ = rms
    wrong = ("import torch\n"
             "def rms_norm(x, weight, eps):\n"
             "    xf = x.float()\n"
             "    xc = xf - xf.mean(-1, keepdim=True)\n"
             "    y = xc / torch.sqrt(xc.pow(2).mean(-1, keepdim=True) + eps)\n"
             "    return y.to(x.dtype) * weight\n")
    assert_feedback(ex.check(wrong), "Likely mistake", "LayerNorm")


@pytest.mark.parametrize("body,needle", [
    ("raise ValueError('no')", "raised ValueError: no"),
    ("return 3.0", "expected a Tensor"),
    ("return x[..., :1]", "expected shape"),
    ("return x.sum(-1)", "expected shape"),
])
def test_rms_broken_code_gets_feedback(rms, body, needle):
    _, ex, _ = rms
    code = f"import torch\ndef rms_norm(x, weight, eps):\n    {body}\n"
    assert_feedback(ex.check(code), needle)
