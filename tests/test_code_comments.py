"""Starter-code comments in the reader's language:
course_lib.notebook.code_comments and the function exercise's views.

The reference for "the code is unchanged" is Python's tokenizer: every
token of the code that is not a comment, with its text, must be the same
before and after translation (only the line numbers of code after a
comment that changed length may move).
"""
import io
import tokenize

import pytest

from course_lib.notebook import sandbox
from course_lib.notebook.code_comments import comment_texts, \
    translate_comments
from course_lib.notebook.function_exercise import FunctionExercise
from course_lib.notebook import i18n
from course_lib.notebook.i18n import set_language

CODE = (
    "def f(x, n):  # the answer goes here\n"
    "    s = '# not a comment, a string'\n"
    "    # 1) first step of the work,\n"
    "    #    still the first step\n"
    "    # 2) second step\n"
    "    y = x * 2   # (B, T, d_h)\n"
    "    if n:\n"
    "        # a deeper comment of its own\n"
    "        y = -y\n"
    "    return y\n")

ZH = {"the answer goes here": "答案写在这里",
      "1) first step of the work,\n   still the first step":
          "1) 第一步，\n   仍是第一步\n   再多一行",
      "2) second step": "2) 第二步",
      "a deeper comment of its own": "更深一层的注释"}


def _code_tokens(code: str) -> list[tuple[int, str]]:
    """Every token that is not a comment or a line break: (type, text)."""
    skip = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE}
    return [(t.type, t.string) for t in tokenize.generate_tokens(
        io.StringIO(code).readline) if t.type not in skip]


def test_comments_are_cut_into_steps_and_notation_is_left_out():
    assert comment_texts(CODE) == [
        "the answer goes here",
        "1) first step of the work,\n   still the first step",
        "2) second step",
        "a deeper comment of its own"]
    assert comment_texts("x = 1  # (B, T, d_h)\n# h_0, int64\n") == []
    assert comment_texts("def f(:\n  # broken code\n") == []    # no tokens


def test_translated_comments_leave_the_code_unchanged():
    out = translate_comments(CODE, lambda t: ZH.get(t, t))
    assert _code_tokens(out) == _code_tokens(CODE)
    assert out.splitlines() == [
        "def f(x, n):  # 答案写在这里",
        "    s = '# not a comment, a string'",
        "    # 1) 第一步，",
        "    #    仍是第一步",
        "    #    再多一行",
        "    # 2) 第二步",
        "    y = x * 2   # (B, T, d_h)",
        "    if n:",
        "        # 更深一层的注释",
        "        y = -y",
        "    return y"]
    assert translate_comments(CODE, lambda t: t) == CODE
    # a comment after code stays on its line; no final newline is added
    assert translate_comments("x = 1  # one more word", lambda t: "甲\n乙") \
        == "x = 1  # 甲 乙"


def test_bad_arguments_name_themselves():
    with pytest.raises(TypeError, match="code must be a str"):
        comment_texts(b"# bytes")
    with pytest.raises(TypeError, match="translate must be callable"):
        translate_comments("# some words here", {"a": "b"})


@pytest.fixture
def zh():
    set_language("zh")
    yield
    set_language("en")


def _exercise():
    return FunctionExercise(
        key="t-comments", purpose="application", prompt="Write `f`.",
        func_name="f", starter_code=(
            "def f(x):\n"
            "    # your code: double x\n"
            "    ...\n"),
        reference=lambda x: 2 * x, cases=[((3,), {})], hint="h",
        solution="s")


def test_function_exercise_shows_its_starter_comments_in_chinese(
        zh, monkeypatch):
    monkeypatch.setitem(i18n.catalog("zh"), "your code: double x",
                        "在这里写代码：把 x 加倍")
    # in this process: starting the sandbox's child takes seconds, and
    # how a source reaches it does not depend on its comments
    monkeypatch.setattr(sandbox, "AVAILABLE", False)
    ex = _exercise()
    shown = "def f(x):\n    # 在这里写代码：把 x 加倍\n    ...\n"
    assert ex.shown_starter_code() == shown
    assert ex.starter_code.endswith("# your code: double x\n    ...\n")
    assert ex.widget() is not None and ex.input.value == shown  # Colab
    assert "# 在这里写代码：把 x 加倍" in ex.static_html()        # the book
    # the learner fills in the Chinese starter code; it runs as it is
    answer = shown.replace("    ...\n", "    return 2 * x\n")
    assert ex.check(answer).correct


def test_function_exercise_in_english_shows_the_starter_code_as_written(
        monkeypatch):
    monkeypatch.setitem(i18n.catalog("zh"), "your code: double x", "加倍")
    ex = _exercise()
    assert ex.shown_starter_code() == ex.starter_code
    assert "# your code: double x" in ex.static_html()
