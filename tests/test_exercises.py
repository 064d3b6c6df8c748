"""Exercise checkers, driven headlessly: set widget values, click, read.

Every wrong answer, wrong type, wrong shape, NaN and exception raised in a
learner's code must come back as feedback text, never as a traceback.
"""
import math
import re

import numpy as np
import pytest
import torch

from course_lib.notebook.exercises import (ChoiceExercise, Feedback,
                                           NumericExercise, parse_number)
from course_lib.notebook.function_exercise import (FunctionExercise,
                                                   compare_values)


def numeric():
    return NumericExercise(
        key="t-decay",
        purpose="application", prompt="What is $0.9^{50}$?", answer=0.9 ** 50,
        rtol=0.02, mistakes=[(0.9 * 50, "You multiplied instead of taking "
                              "a power.")],
        hint="Repeated multiplication.", solution="$0.9^{50}$.")


def choice():
    return ChoiceExercise(
        key="t-path",
        purpose="application", prompt="Path length of self-attention?",
        options=["O(1)", "O(log L)", "O(L)"], answer=0,
        explanations=["Every token sees every other directly.",
                      "That is a dilated CNN.", "That is an RNN."],
        hint="Count the hops.", solution="O(1).")


def causal_mask(q_len):
    return torch.ones(q_len, q_len).tril().bool()


def function():
    return FunctionExercise(
        key="t-causal",
        purpose="application", prompt="Implement `causal_mask(q_len)`.",
        func_name="causal_mask",
        starter_code="def causal_mask(q_len):\n    ...\n",
        reference=causal_mask, cases=[((1,), {}), ((4,), {})],
        hint="torch.tril", solution="```python\ntorch.ones(n, n).tril()\n```")


def click(ex, value):
    """Drive the live widget like a learner: type/pick, press Check."""
    ex.widget()
    ex.input.value = value
    ex.check_button.click()
    return ex.last_feedback, ex.feedback.value


# -- numeric --------------------------------------------------------------
@pytest.mark.parametrize("answer", [0.9 ** 50, "0.00515", 0.00520,
                                    np.float64(0.9 ** 50),
                                    torch.tensor(0.9 ** 50)])
def test_numeric_accepts_within_tolerance(answer):
    fb = numeric().check(answer)
    assert fb.correct, fb.message
    assert fb.message.startswith("Correct")


def test_numeric_tolerance_is_relative():
    ex = numeric()
    assert not ex.check(0.9 ** 50 * 1.03).correct
    assert ex.check(0.9 ** 50 * 1.019).correct


def test_numeric_names_a_known_mistake():
    fb = numeric().check(45)
    assert not fb.correct
    assert "multiplied instead" in fb.message


def test_numeric_says_too_large_or_too_small():
    assert "too large" in numeric().check(0.5).message
    assert "too small" in numeric().check(1e-9).message


@pytest.mark.parametrize("bad,needle", [
    ("", "empty"), ("abc", "not a number"), ("nan", "not a number"),
    (float("nan"), "not a finite"), (float("inf"), "not a finite"),
    ([1, 2], "got a list"), (True, "not True/False"), (None, "NoneType"),
    (torch.ones(3), "got a Tensor"), ("1/0", "not a number")])
def test_numeric_bad_input_is_feedback(bad, needle):
    fb = numeric().check(bad)
    assert not fb.correct
    assert needle in fb.message


def test_numeric_fraction_text():
    ex = NumericExercise(key="t-frac", purpose="application", prompt="p", answer=2 / 3,
                         hint="h", solution="s")
    assert ex.check("2/3").correct
    assert not ex.check("1/3").correct


def test_numeric_widget_round_trip():
    ex = numeric()
    fb, shown = click(ex, "45")
    assert not fb.correct and "multiplied instead" in shown
    fb, shown = click(ex, "0.005154")
    assert fb.correct and "Correct" in shown
    fb, shown = click(ex, "garbage")
    assert not fb.correct and "not a number" in shown


def test_hint_and_solution_toggle():
    ex = numeric()
    ex.widget()
    assert ex.hint_box.value == "" and ex.solution_box.value == ""
    ex.hint_button.click()
    assert "Repeated multiplication" in ex.hint_box.value
    ex.hint_button.click()
    assert ex.hint_box.value == ""
    ex.solution_button.click()
    assert "0.9^{50}" in ex.solution_box.value


def test_numeric_rejects_bad_construction():
    with pytest.raises(ValueError, match="tolerances"):
        NumericExercise(key="t-x", purpose="application", prompt="p", answer=1, hint="h",
                        solution="s", rtol=0, atol=0)
    with pytest.raises(ValueError, match="key must be a lowercase slug"):
        NumericExercise(key="Bad Key", purpose="application", prompt="p", answer=1, hint="h",
                        solution="s")
    with pytest.raises(ValueError, match="prompt must be a non-empty"):
        NumericExercise(key="t-x", purpose="application", prompt=" ", answer=1, hint="h",
                        solution="s")


# -- choice ---------------------------------------------------------------
def test_choice_right_and_wrong_with_explanations():
    ex = choice()
    assert ex.check(0).correct
    assert ex.check("O(1)").correct
    fb = ex.check(2)
    assert not fb.correct and "That is an RNN" in fb.message


@pytest.mark.parametrize("bad,needle", [
    (None, "Pick an option"), (7, "no option 7"), (-1, "no option -1"),
    ("O(n^2)", "not one of the options"), (1.5, "not a float"),
    (True, "not a bool")])
def test_choice_bad_input_is_feedback(bad, needle):
    fb = choice().check(bad)
    assert not fb.correct
    assert needle in fb.message


def test_choice_widget_round_trip():
    ex = choice()
    fb, shown = click(ex, None)
    assert not fb.correct and "Pick an option" in shown
    fb, shown = click(ex, "O(L)")
    assert not fb.correct and "RNN" in shown
    fb, shown = click(ex, "O(1)")
    assert fb.correct


def test_choice_rejects_bad_construction():
    with pytest.raises(ValueError, match="answer must be an index"):
        ChoiceExercise(key="t-c", purpose="application", prompt="p", options=["a", "b"], answer=2,
                       hint="h", solution="s")
    with pytest.raises(ValueError, match="distinct"):
        ChoiceExercise(key="t-c", purpose="application", prompt="p", options=["a", "a"], answer=0,
                       hint="h", solution="s")
    with pytest.raises(ValueError, match="one entry per option"):
        ChoiceExercise(key="t-c", purpose="application", prompt="p", options=["a", "b"], answer=0,
                       hint="h", solution="s", explanations=["x"])


# -- function -------------------------------------------------------------
def test_function_accepts_correct_callable_and_source():
    ex = function()
    assert ex.check(causal_mask).correct
    src = ("def causal_mask(q_len):\n"
           "    return torch.tril(torch.ones(q_len, q_len, "
           "dtype=torch.bool))\n")
    fb = ex.check(src)
    assert fb.correct and "All 2 cases pass" in fb.message


@pytest.mark.parametrize("source,needle", [
    ("def causal_mask(q_len):\n    return torch.ones(q_len, q_len)"
     ".triu().bool()\n", "entry (0, 1) should be False, got True"),
    ("def causal_mask(q_len):\n    return torch.ones(q_len, q_len + 1)"
     ".bool()\n", "expected shape (1, 1), got shape (1, 2)"),
    ("def causal_mask(q_len):\n    return torch.ones(q_len, q_len)"
     ".tril()\n", "expected dtype torch.bool, got torch.float32"),
    ("def causal_mask(q_len):\n    return [[True]]\n",
     "expected a Tensor, got [[True]]"),
    ("def causal_mask(q_len):\n    return None\n",
     "expected a Tensor, got None"),
    ("def causal_mask(q_len):\n    x = 1\n    return x / 0\n",
     "raised ZeroDivisionError: division by zero (line 3 of your code)"),
    ("def causal_mask(q_len)\n    return 1\n", "Syntax error on line 1"),
    ("def mask(q_len):\n    return 1\n", "Define a function named"),
    ("raise RuntimeError('boom')\n", "raised RuntimeError: boom"),
    ("def causal_mask(q_len):\n    ...\n", "got None"),
    (42, "not a int"),
])
def test_function_failures_are_feedback(source, needle):
    fb = function().check(source)
    assert not fb.correct
    assert needle in fb.message, fb.message


def test_function_reports_first_failing_case_with_call():
    # Right for q_len=1, wrong for q_len=4: case 2 must be named.
    src = "def causal_mask(q_len):\n    return torch.ones(q_len, q_len).bool()"
    fb = function().check(src)
    assert fb.message.startswith("Case 2, `causal_mask(4)`")


def test_function_nan_and_value_mismatch():
    ex = FunctionExercise(
        key="t-soft",
        purpose="application", prompt="softmax", func_name="f", starter_code="",
        reference=lambda x: torch.softmax(x, -1),
        cases=[((torch.tensor([1.0, 2.0, 3.0]),), {})], hint="h",
        solution="s")
    fb = ex.check(lambda x: x * float("nan"))
    assert "contains NaN" in fb.message
    fb = ex.check(lambda x: torch.exp(x))
    assert re.search(r"values differ: at index \(2,\) expected 0\.665",
                     fb.message)


def test_function_inputs_are_copied_per_call():
    seen = []

    def reference(x):
        seen.append(x.clone())
        return x.sum()

    def mutating(x):
        out = x.sum()
        x.mul_(0)          # a learner bug that must not corrupt the case
        return out

    ex = FunctionExercise(key="t-sum", purpose="application", prompt="p", func_name="f",
                          starter_code="", reference=reference,
                          cases=[((torch.ones(3),), {})] * 2, hint="h",
                          solution="s")
    assert ex.check(mutating).correct
    assert all(torch.equal(s, torch.ones(3)) for s in seen)


def test_function_widget_round_trip():
    ex = function()
    fb, shown = click(ex, "def causal_mask(q_len):\n    return 1/0\n")
    assert not fb.correct and "ZeroDivisionError" in shown
    assert "Traceback" not in shown
    fb, shown = click(ex, "def causal_mask(n):\n    return torch.ones(n, n)"
                          ".tril().bool()\n")
    assert fb.correct


def test_safe_check_turns_checker_bugs_into_feedback():
    ex = function()
    ex.reference = lambda q_len: 1 / 0   # a broken reference, not learner
    fb = ex.safe_check(causal_mask)
    assert isinstance(fb, Feedback) and not fb.correct
    assert "Could not check" in fb.message


def test_function_rejects_bad_construction():
    kwargs = dict(key="t-f", purpose="application", prompt="p",
                  func_name="f", starter_code="",
                  reference=abs, hint="h", solution="s")
    with pytest.raises(ValueError, match="cases must hold"):
        FunctionExercise(cases=[], **kwargs)
    with pytest.raises(ValueError, match=r"cases\[0\] must be"):
        FunctionExercise(cases=[(1,)], **kwargs)
    with pytest.raises(ValueError, match="func_name must be an identifier"):
        FunctionExercise(cases=[((1,), {})],
                         **{**kwargs, "func_name": "not valid"})


# -- helpers --------------------------------------------------------------
def test_compare_values_closed_cases():
    assert compare_values(1.0, 1.0 + 1e-9) is None
    assert "expected 1" in compare_values(1.0, 2.0)
    assert compare_values([1, torch.ones(2)], (1, torch.ones(2))) is None
    assert "element 1" in compare_values([1, torch.ones(2)],
                                         [1, torch.zeros(2)])
    assert compare_values(np.ones(2), torch.ones(2, dtype=torch.float64)) \
        is None
    assert compare_values("abc", "abc") is None


def test_parse_number():
    assert parse_number("1,000") == 1000
    assert math.isclose(parse_number(" 3/4 "), 0.75)
    with pytest.raises(ValueError):
        parse_number("three")


# -- static HTML ----------------------------------------------------------
def test_static_html_is_deterministic_and_self_contained():
    for make in (numeric, choice, function):
        a, b = make().static_html(), make().static_html()
        assert a == b
        assert "<details class=\"ti-solution\">" in a
        assert "http" not in a          # nothing loaded from elsewhere
    html = numeric().static_html()
    assert r"\(0.9^{50}\)" in html      # math delimiters MathJax reads
    assert '"answer": 0.00515' in html


def test_mime_bundle_has_widget_and_html(monkeypatch):
    monkeypatch.delenv("COURSE_SIMULATE_COLAB", raising=False)
    bundle = numeric()._repr_mimebundle_()
    assert set(bundle) == {"text/plain", "text/html",
                           "application/vnd.jupyter.widget-view+json"}
    assert bundle["text/plain"] == "NumericExercise('t-decay')"
    # On Colab only the widget: the HTML copy would compete with it.
    monkeypatch.setenv("COURSE_SIMULATE_COLAB", "1")
    assert "text/html" not in numeric()._repr_mimebundle_()


def test_compare_values_ignores_matching_infinities():
    # Filtered logits hold -inf; a mismatch must be reported where the
    # values really differ, not at a position where both are -inf.
    inf = float("inf")
    expected = torch.tensor([1.0, -inf, 0.5, -inf])
    got = torch.tensor([1.0, -inf, -inf, -inf])
    assert compare_values(expected, got) == \
        "values differ: at index (2,) expected 0.5, got -inf"
    assert compare_values(expected, expected.clone()) is None


# ------------------------------------- one number grammar, Python and the page
GRAMMAR_CASES = [
    "0.25", "-2.5e-3", "1/4", " 3 / 4 ", "2362368", "2,362,368", "1,234.5",
    "0,6652", "1,5", "-0,5", "1,500", "0,500", ".5", "5.", "1e3", "1E-2",
    "+7", "", "abc", "1_000", "0x10", "0b101", "0o7", "١٢", "１２", "1,2,3",
    "12,34,567", "1/0", "inf", "nan", "1e999", "--1", "1 000", "2/3/4"]


def _python_parse(text):
    try:
        return parse_number(text)
    except ValueError:
        return None


@pytest.mark.parametrize("text, value", [
    ("0,6652", 0.6652), ("1,5", 1.5), ("-0,5", -0.5), ("2,362,368", 2362368),
    ("1,234.5", 1234.5), ("1,500", 1500.0), ("0,500", 0.5),
    ("1_000", None), ("١٢", None), ("１２", None), ("1,2,3", None)])
def test_decimal_commas_and_thousands_are_read_as_meant(text, value):
    # The parser deleted every comma, so 0,6652 became 6652.
    assert _python_parse(text) == value


def test_the_page_checker_reads_numbers_exactly_as_python():
    import json
    import shutil
    import subprocess
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed: the page's JavaScript parser "
                    "cannot be run outside a browser")
    html_ = numeric()._static_body()
    start = html_.index("  // the grammar")
    stop = html_.index("  function close")
    script = (html_[start:stop] + "\nconsole.log(JSON.stringify("
              + json.dumps(GRAMMAR_CASES) + ".map(parse)));\n"
              + "console.log(JSON.stringify([2362368, 0.6652, 1e-5, 2.5]"
              + ".map(exact)));")
    out = subprocess.run([node, "-e", script], capture_output=True,
                         text=True, check=True).stdout.splitlines()
    js = json.loads(out[0])
    assert js == [_python_parse(t) for t in GRAMMAR_CASES]
    assert json.loads(out[1])[:2] == ["2362368", "0.6652"]


def test_correct_shows_the_learners_exact_number():
    ex = NumericExercise(key="t-exact", purpose="application", prompt="p", answer=2362368,
                         hint="h", solution="s")
    assert ex.check("2,362,368").message == "Correct: 2362368."
    assert "2362370" not in ex.check("2362368").message


def test_a_huge_answer_is_not_echoed_back():
    fb = numeric().check("x" * 10_000_000)
    assert not fb.correct and len(fb.message) < 200


def test_odd_numbers_given_directly_are_feedback_not_errors():
    # check() raised OverflowError for 10**400 and RuntimeError for
    # a meta tensor; NumericExercise(rtol=nan) marked every answer wrong.
    ex = numeric()
    assert "too large" in ex.check(10 ** 400).message
    assert "holds no value" in ex.check(torch.empty((), device="meta")).message
    for bad in (dict(rtol=float("nan")), dict(atol=-1.0)):
        with pytest.raises(ValueError, match="tol"):
            NumericExercise(key="t-x", purpose="application", prompt="p", answer=1.0, hint="h",
                            solution="s", **bad)


def test_static_html_renders_markdown_everywhere():
    # Options, feedback and prompts showed raw $..$ and *word*
    ch = ChoiceExercise(key="t-md", purpose="application", prompt="Pick *one*.",
                        options=["It is $b_i$.", "plain"], answer=1,
                        hint="*Think*.", solution="s",
                        explanations=["No: $k^R$ is *shared*.", "Yes."])
    html_ = ch.static_html()
    assert r"> It is \(b_i\).</label>" in html_
    assert r"No: \\(k^R\\) is <em>shared<\/em>." in html_   # in the JSON
    assert "<em>one</em>" in html_ and "<em>Think</em>" in html_
    assert "innerHTML" in html_ and "MathJax.typesetPromise" not in html_
    assert "mj.typesetPromise([out])" in html_
    num = NumericExercise(key="t-md2", purpose="application", prompt="p", answer=1, hint="h",
                          solution="s", mistakes=[(2, "left out $k^R$")])
    assert r"left out \\(k^R\\)" in num.static_html()


def test_static_controls_are_named_and_enter_checks():
    html_ = numeric().static_html()
    assert 'aria-label="Answer to exercise t-decay"' in html_
    assert 'e.key === "Enter"' in html_
    ch = ChoiceExercise(key="t-radio", purpose="application", prompt="p", options=["a", "b"],
                        answer=0, hint="h", solution="s").static_html()
    assert 'role="radiogroup"\naria-label="Options for exercise t-radio"' \
        in ch
    assert ch.count('name="ti-ex-t-radio-opt"') == 2
    assert 'e.key === "Enter"' in ch


def test_static_data_cannot_close_its_script():
    ch = ChoiceExercise(key="t-script", purpose="application", prompt="p", options=["a", "b"],
                        answer=0, hint="h", solution="s",
                        explanations=["</script><b>x</b>", "`</p>`"])
    body = ch._static_body()
    script = body[body.index("<script>") + 8:body.index("</script>")]
    assert "</" not in script


def test_purpose_is_checked_and_shown():
    with pytest.raises(ValueError, match="purpose must be one of"):
        NumericExercise(key="t-p", purpose="quiz", prompt="p", answer=1,
                        hint="h", solution="s")
    ex = NumericExercise(key="t-p", purpose="application", prompt="p",
                         answer=0.25, hint="h", solution="s")
    assert 'data-purpose="application"' in ex.static_html()
    assert "<strong>Exercise.</strong>" in ex.static_html()
    assert "measures" not in ex.check("0.3").message


def test_a_prediction_tells_what_the_experiment_measures():
    ex = NumericExercise(key="t-pred", purpose="prediction", prompt="p",
                         answer=0.123456, rtol=0.1, hint="h", solution="s",
                         mistakes=[(0.5, "That is the prior.")])
    html = ex.static_html()
    assert "<strong>Prediction.</strong>" in html
    assert 'data-purpose="prediction"' in html
    measured = "The experiment in the next cell measures 0.1235."
    for answer, correct in (("0.12", True), ("0.5", False), ("9", False),
                            ("0.01", False)):
        fb = ex.check(answer)
        assert fb.correct is correct and fb.message.endswith(measured)
    assert "That is the prior." in ex.check("0.5").message
    assert measured in html                 # the page's copy says the same
    assert "measures" not in ex.check("hello").message   # nothing committed
