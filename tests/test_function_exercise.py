"""Learner code that loops, sleeps, exits or is interrupted (chapter 1's
function exercises, used in chapters 1-5, 8 and 11).

A submission calling ``sys.exit()`` once killed a real kernel, and one with
an endless loop hung it. These tests run such submissions through
``check``, through the widget's Check button, and in a real Jupyter kernel,
whose survival is the property that matters.
"""
import signal
import textwrap
import time

import pytest

from course_lib.notebook import sandbox
from course_lib.notebook.function_exercise import (FunctionExercise,
                                                   LearnerTimeout, time_limit)


def square_exercise(limit=0.5):
    return FunctionExercise(
        key="t-square",
        purpose="application", prompt="Return `x * x`.", func_name="square",
        starter_code="def square(x):\n    ...\n", reference=lambda x: x * x,
        cases=[((3,), {}), ((-2,), {})], hint="multiply",
        solution="```python\nreturn x * x\n```", time_limit=limit)


LOOP = "def square(x):\n    while True:\n        pass\n"
SLEEP = "import time\ndef square(x):\n    time.sleep(60)\n"
TOP_LOOP = "while True:\n    pass\n"
SWALLOW = ("def square(x):\n    while True:\n        try:\n"
           "            pass\n        except Exception:\n            pass\n")


@pytest.mark.parametrize("source, needle", [
    (LOOP, "Case 1, `square(3)`: your function did not finish within 0.5 s"),
    (SLEEP, "your function did not finish within 0.5 s"),
    (SWALLOW, "did not finish within 0.5 s"),
    (TOP_LOOP, "Running your code did not finish within 0.5 s"),
    ("import sys\nsys.exit(0)\n", "Running your code called exit()"),
    ("exit()\n", "Running your code called exit()"),
    ("def square(x):\n    raise SystemExit(3)\n",
     "Case 1, `square(3)`: your function called exit()"),
    ("def square(x):\n    raise KeyboardInterrupt\n",
     "was interrupted (KeyboardInterrupt)"),
])
def test_bad_learner_code_becomes_feedback(source, needle):
    sandbox.warm_up(wait=True)      # time the run, not Python's start-up
    start = time.perf_counter()
    fb = square_exercise().check(source)
    assert not fb.correct and needle in fb.message, fb.message
    assert time.perf_counter() - start < 5       # the limit, not a hang


def test_widget_click_reports_a_loop_and_stays_usable():
    ex = square_exercise()
    ex.widget()
    ex.input.value = LOOP
    ex.check_button.click()
    assert "did not finish within 0.5 s" in ex.last_feedback.message
    ex.input.value = "def square(x):\n    return x * x\n"
    ex.check_button.click()
    assert ex.last_feedback.correct


def test_time_limit_restores_the_previous_handler_and_timer():
    before = signal.getsignal(signal.SIGALRM)
    with pytest.raises(LearnerTimeout):
        with time_limit(0.05):
            time.sleep(1)
    assert signal.getsignal(signal.SIGALRM) is before
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    with time_limit(None):           # no limit: the block just runs
        time.sleep(0.01)


@pytest.mark.parametrize("bad, error", [
    (0, ValueError), (-1.0, ValueError), (float("nan"), ValueError),
    ("5", TypeError)])
def test_bad_limits_raise(bad, error):
    with pytest.raises(error, match="time_limit must be"):
        square_exercise(limit=bad)
    with pytest.raises(error, match="seconds must be"):
        with time_limit(bad):
            pass


def test_a_real_kernel_survives_exit_and_loops():
    """Click Check in a real ipykernel with code that exits, then loops;
    the kernel must answer afterwards, with its state intact."""
    jupyter_client = pytest.importorskip("jupyter_client")
    km, kc = jupyter_client.manager.start_new_kernel(kernel_name="python3")
    try:
        def run(code, timeout=120):
            out = []
            reply = kc.execute_interactive(
                textwrap.dedent(code), timeout=timeout,
                output_hook=lambda m: out.append(m["content"].get("text", "")))
            return reply["content"]["status"], "".join(out)

        status, _ = run("""
            from course_lib.notebook.function_exercise import FunctionExercise
            ex = FunctionExercise(
                key="k-square",
                purpose="application", prompt="p", func_name="square",
                starter_code="", reference=lambda x: x * x,
                cases=[((3,), {})], hint="h", solution="s",
                time_limit=1.0)
            ex.widget()
            state = 41
            """)
        assert status == "ok"
        for code, needle in [
                ("import sys\\nsys.exit(0)\\n", "called exit()"),
                (LOOP.replace("\n", "\\n"), "within 1 s"),
                # these ended the kernel before learner code ran in a child
                ("import os\\nos._exit(0)\\n", "ended the process"),
                ("import os, signal\\nos.kill(os.getpid(), signal.SIGKILL)"
                 "\\n", "ended the process"),
                ("import ctypes\\nctypes.string_at(0)\\n",
                 "ended the process"),
                ("import torch\\ntorch.allclose = lambda *a, **k: True\\n"
                 "def square(x):\\n    return 0\\n", "expected 9")]:
            status, out = run(f"""
                ex.input.value = "{code}"
                ex.check_button.click()
                print(ex.last_feedback.message)
                """)
            assert status == "ok" and needle in out, out
        assert km.is_alive()
        status, out = run("import torch\nprint(state + 1, "
                          "torch.allclose(torch.zeros(1), torch.ones(1)))")
        assert status == "ok" and out.strip() == "42 False"
        status, out = run("print(state + 1)")
        assert status == "ok" and out.strip() == "42"
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def test_a_complex_result_where_a_real_one_is_expected_is_a_mismatch():
    import torch
    from course_lib.notebook.function_exercise import compare_values
    t = torch.randn(3)
    assert "complex" in compare_values(t, t + 1e3j)
    assert "complex" in compare_values(t, t + 0j)
    c = t + 2j
    assert compare_values(c, c.clone()) is None
    assert compare_values(c, c + 1e-3j) is not None
