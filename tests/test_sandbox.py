"""Hostile submissions to a function exercise (the bad-input probe of
2026-12-05, area 2): every way it found to fool the checker or to kill or
wedge the kernel, each now run through ``check`` with code as a learner
types it. Learner code runs in a child process (course_lib.notebook.sandbox)
that never sees the reference or the expected values and can send back
only plain data; these tests check the verdict, that it comes within the
time limit plus the hard deadline, and that nothing leaks into this
process (patched functions stay unpatched here).
"""
import math
import time

import numpy as np
import pytest
import torch

from course_lib.notebook import sandbox
from course_lib.notebook.exercises import parse_number
from course_lib.notebook.function_exercise import (DiagnosedFunctionExercise,
                                                   FunctionExercise)

pytestmark = pytest.mark.skipif(not sandbox.AVAILABLE,
                                reason="needs POSIX process control")

LIMIT = 1.0
# one case whose answer is a tensor, one whose answer is a float
CASES = [((torch.tensor([3.0, -1.0]),), {}), ((torch.tensor([0.5]),), {})]


def square(x):
    return torch.diag_embed(x).diagonal(dim1=-2, dim2=-1) ** 2


def exercise(limit=LIMIT):
    return FunctionExercise(
        key="t-hostile",
        purpose="application", prompt="Return the elementwise square.",
        func_name="square", starter_code="def square(x):\n    ...\n",
        reference=square, cases=CASES, hint="h", solution="s",
        time_limit=limit)


def mean_exercise():
    return FunctionExercise(
        key="t-hostile-mean",
        purpose="application", prompt="Return the mean as a float.",
        func_name="mean", starter_code="def mean(x):\n    ...\n",
        reference=lambda x: float(x.mean()), cases=CASES, hint="h",
        solution="s", time_limit=LIMIT)


def judged(ex, source):
    """The feedback and the seconds the check took once a child is ready."""
    sandbox.warm_up(wait=True)
    start = time.perf_counter()
    fb = ex.check(source)
    return fb, time.perf_counter() - start


RIGHT = "def square(x):\n    return x * x\n"
# "has an instance attribute": plain hasattr is True for anything on
# torch's operator namespaces, and raises on some of its lazy libraries
HAS = ("import gc\n"
       "def has(o, name):\n"
       "    try:\n        return name in vars(o)\n"
       "    except Exception:\n        return False\n")
ZEROS = "def square(x):\n    return torch.zeros_like(x)\n"

FOOLS = {
    # patch what the checker compares with, then return zeros
    "allclose": "torch.allclose = lambda *a, **k: True\n" + ZEROS,
    "tensor_any": "torch.Tensor.any = lambda *a, **k: torch.tensor(False)\n"
                  + ZEROS,
    "isclose": "import math\nmath.isclose = lambda *a, **k: True\n" + ZEROS,
    # patch a function the reference calls, then give a wrong formula
    "reference_call": "torch.diag_embed = lambda x: torch.zeros(x.shape + "
                      "x.shape[-1:])\n" + ZEROS,
    # a Tensor subclass that answers allclose with True
    "liar": ("class Liar(torch.Tensor):\n"
             "    @classmethod\n"
             "    def __torch_function__(cls, func, types, args=(), "
             "kwargs=None):\n"
             "        if func is torch.allclose:\n"
             "            return True\n"
             "        return super().__torch_function__(func, types, args,\n"
             "                                          kwargs or {})\n"
             "def square(x):\n"
             "    return torch.zeros_like(x).as_subclass(Liar)\n"),
    # read the expected value from the checker's frame
    "frame": ("import sys\ndef square(x):\n"
              "    return sys._getframe(1).f_locals['expected']\n"),
    # find the exercise through gc, call its reference or cut its cases
    "gc_reference": (HAS + "refs = [o.reference for o in gc.get_objects()\n"
                     "        if has(o, 'reference') and has(o, 'cases')]\n"
                     "def square(x):\n"
                     "    return refs[0](x)\n"),
    "gc_cases": (HAS + "for o in gc.get_objects():\n"
                 "    if has(o, 'cases') and has(o, 'reference'):\n"
                 "        o.cases = o.cases[:0]\n" + ZEROS),
    # a complex result whose real part is right
    "complex": "def square(x):\n    return x * x + 1e6j\n",
}


@pytest.mark.parametrize("name", sorted(FOOLS))
def test_no_trick_passes_and_nothing_leaks(name):
    allclose, isclose, any_ = torch.allclose, math.isclose, torch.Tensor.any
    limit = 10.0 if name.startswith("gc") else LIMIT   # gc walks take time
    ex = exercise(limit)
    fb, seconds = judged(ex, FOOLS[name])
    assert not fb.correct, (name, fb.message)
    assert fb.message.startswith("Case 1"), fb.message
    assert seconds < limit * 3 + sandbox.MARGIN
    # the patches stayed in the child: this process is untouched
    assert (torch.allclose, math.isclose, torch.Tensor.any) == (
        allclose, isclose, any_)
    assert len(ex.cases) == 2


ENDINGS = {
    "os_exit_in_function": ("import os\ndef square(x):\n    os._exit(0)\n",
                            "ended the process that runs it (exit status 0)"),
    "os_exit_top_level": ("import os\nos._exit(3)\n",
                          "ended the process that runs it (exit status 3)"),
    "sigkill": ("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n",
                "ended the process that runs it (SIGKILL)"),
    "segfault": ("import ctypes\nctypes.string_at(0)\n",
                 "ended the process that runs it (SIGSEGV)"),
    "delayed_exit": ("import os, threading\n"
                     "threading.Timer(0.2, lambda: os._exit(0)).start()\n"
                     "def square(x):\n"
                     "    import time\n    time.sleep(0.5)\n"
                     "    return x * x\n",
                     "ended the process that runs it"),
    "timer_off": ("import signal\ndef square(x):\n"
                  "    signal.setitimer(signal.ITIMER_REAL, 0)\n"
                  "    while True:\n        pass\n",
                  "kept running past its time limit"),
    "timer_ignored": ("import signal\n"
                      "signal.signal(signal.SIGALRM, signal.SIG_IGN)\n"
                      "def square(x):\n    while True:\n        pass\n",
                      "did not finish within 1 s"),
    "own_base_exception": ("class Boom(BaseException):\n    pass\n"
                           "def square(x):\n    raise Boom('no')\n",
                           "raised Boom: no (line 4 of your code)"),
    "generator_exit": ("def square(x):\n    raise GeneratorExit\n",
                       "raised GeneratorExit"),
    "huge_allocation": ("def square(x):\n"
                        "    return torch.empty(50 * 2**30, "
                        "dtype=torch.uint8)\n", "raised RuntimeError"),
}


@pytest.mark.parametrize("name", sorted(ENDINGS))
def test_code_that_ends_or_wedges_its_process_becomes_feedback(name):
    source, needle = ENDINGS[name]
    fb, seconds = judged(exercise(), source)
    assert not fb.correct and needle in fb.message, fb.message
    assert seconds < LIMIT * 3 + sandbox.MARGIN + 2


def test_after_a_crash_and_a_patch_the_next_check_is_judged_as_usual():
    ex = exercise()
    for source in (ENDINGS["segfault"][0], FOOLS["allclose"]):
        assert not ex.check(source).correct
    assert ex.check(RIGHT).correct
    assert not ex.check(ZEROS).correct


def test_a_loop_that_swallows_every_exception_is_killed_at_the_deadline():
    source = ("import signal\ndef square(x):\n"
              "    while True:\n"
              "        try:\n"
              "            signal.setitimer(signal.ITIMER_REAL, 0)\n"
              "            while True:\n                pass\n"
              "        except BaseException:\n"
              "            pass\n")
    fb, seconds = judged(exercise(), source)
    assert "kept running past its time limit" in fb.message, fb.message
    assert LIMIT * 3 + sandbox.MARGIN - 0.5 < seconds < \
        LIMIT * 3 + sandbox.MARGIN + 5


def test_printing_a_million_lines_is_cut_short():
    source = ("def square(x):\n    for i in range(10**6):\n"
              "        print(i)\n    return x * x\n")
    fb, _ = judged(exercise(), source)
    printed = fb.message.split("Your code printed:")[1]
    assert len(printed) < sandbox.MAX_PRINTED + 100
    assert "\n0\n1\n2\n" in printed


def test_what_the_code_prints_is_shown_with_the_verdict():
    fb, _ = judged(exercise(), "def square(x):\n    print('shape', "
                               "tuple(x.shape))\n    return x * x\n")
    assert fb.correct and "shape (2,)" in fb.message


def test_a_long_string_result_is_judged_at_once():
    fb, seconds = judged(mean_exercise(),
                         "def mean(x):\n    return '1' * 30000 + 'x'\n")
    assert not fb.correct and "expected a number" in fb.message
    assert seconds < LIMIT * 3 + sandbox.MARGIN


def test_a_slow_tensor_subclass_comes_back_as_a_plain_tensor():
    source = ("import time\n"
              "class Slow(torch.Tensor):\n"
              "    def double(self):\n"
              "        time.sleep(40)\n"
              "        return super().double()\n"
              "def square(x):\n"
              "    return (x * x).as_subclass(Slow)\n")
    fb, seconds = judged(exercise(), source)
    assert seconds < LIMIT * 3 + sandbox.MARGIN
    # either judged as the plain tensor it holds, or refused: never slow
    assert fb.correct or "cannot read back" in fb.message, fb.message


def test_an_enormous_source_is_refused_before_compiling():
    source = "x = 1\n" * 400_000
    start = time.perf_counter()
    fb = exercise().check(source)
    assert not fb.correct and "characters long" in fb.message
    assert time.perf_counter() - start < 1


def test_the_child_never_receives_the_reference_or_the_expected_values():
    source = (HAS + "found = [type(o).__name__ for o in gc.get_objects()\n"
              "         if has(o, 'reference') and has(o, 'cases')]\n"
              "def square(x):\n"
              "    print('found', found)\n"
              "    return x * x\n")
    fb, _ = judged(exercise(limit=10.0), source)
    assert "found []" in fb.message, fb.message


def test_a_diagnosed_mistake_that_raises_is_named_across_the_process():
    ex = DiagnosedFunctionExercise(
        key="t-diag",
        purpose="application", prompt="p", func_name="inv", starter_code="",
        reference=lambda x: 1.0 / (x + 1.0), cases=[((0.0,), {})],
        hint="h", solution="s", time_limit=LIMIT,
        mistakes=[(lambda x: 1.0 / x, "divided by x, not x + 1")])
    fb, _ = judged(ex, "def inv(x):\n    return 1.0 / x\n")
    assert "ZeroDivisionError" in fb.message
    assert "divided by x, not x + 1" in fb.message


# ---------------------------------------------------------------------------
# The data that crosses the process boundary
# ---------------------------------------------------------------------------
class _Mine:
    def __repr__(self):
        return "<mine>"


@pytest.mark.parametrize("value", [
    None, True, 3, 2.5, float("nan"), "text", 1 + 2j,
    [1, (2.0, "x")], {"a": [1, 2]}, torch.arange(6.0).reshape(2, 3),
    torch.tensor([True, False])])
def test_plain_values_cross_unchanged(value):
    back = sandbox._decode(sandbox._encode(value))
    if isinstance(value, torch.Tensor):
        assert type(back) is torch.Tensor and torch.equal(back, value)
    elif isinstance(value, float) and math.isnan(value):
        assert math.isnan(back)
    else:
        assert back == value and type(back) is type(value)


def test_other_values_cross_as_plain_data_or_opaque():
    sub = torch.ones(2).as_subclass(type("Sub", (torch.Tensor,), {}))
    back = sandbox._decode(sandbox._encode(sub))
    assert type(back) is torch.Tensor and torch.equal(back, torch.ones(2))
    arr = sandbox._decode(sandbox._encode(np.arange(3.0)))
    assert torch.equal(arr, torch.arange(3.0, dtype=torch.float64))
    assert sandbox._decode(sandbox._encode(np.float32(1.5))) == 1.5
    opaque = sandbox._decode(sandbox._encode(_Mine()))
    assert isinstance(opaque, sandbox.Opaque) and repr(opaque) == "<mine>"
    assert opaque != opaque
    long = sandbox._decode(sandbox._encode("1" * 30000))
    assert len(long) == sandbox.MAX_TEXT


def test_parse_number_refuses_long_text_at_once():
    start = time.perf_counter()
    for text in ["1" * 20000, "1" * 20000 + "x", "1" * 20000 + "/x",
                 "1" * 200_000 + "x"]:
        with pytest.raises(ValueError, match="characters long"):
            parse_number(text)
    assert time.perf_counter() - start < 0.5


def test_the_number_grammar_is_linear_without_the_length_limit():
    from course_lib.notebook import exercises
    start = time.perf_counter()
    for text in ["1" * 20000 + "x", "1" * 20000 + "/x", "1" * 20000 + ".x"]:
        assert exercises._NUMBER_RE.match(text) is None
        assert exercises._FRACTION_RE.match(text) is None
    # the quadratic pattern took 8.5 s on 20,000 digits
    assert time.perf_counter() - start < 1.0


def test_a_str_subclass_that_equals_everything_is_not_an_option():
    from course_lib.notebook.exercises import ChoiceExercise

    class Liar(str):
        def __eq__(self, other):
            return True
        __hash__ = str.__hash__

    ex = ChoiceExercise(key="t-liar", purpose="application", prompt="p", options=["a", "b"],
                        answer=0, explanations=["x", "y"], hint="h",
                        solution="s")
    assert not ex.check(Liar("b")).correct
    assert not ex.check(Liar("zzz")).correct
    assert ex.check(Liar("a")).correct           # the text itself is right


def test_a_one_element_tensor_is_a_number_like_a_0d_one():
    assert parse_number(torch.tensor([0.25])) == 0.25
    with pytest.raises(ValueError, match="got a Tensor"):
        parse_number(torch.tensor([0.25, 0.5]))
