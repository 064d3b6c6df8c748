"""Exercises and explorers in Chinese: course_lib.notebook.i18n."""
import ast
import string
from pathlib import Path

import pytest

from course_lib.notebook import i18n
from course_lib.notebook.function_exercise import DiagnosedFunctionExercise
from course_lib.notebook.exercises import ChoiceExercise, NumericExercise
from course_lib.notebook.function_exercise import FunctionExercise
from course_lib.notebook.i18n import catalog, get_language, set_language, tr
from course_lib.notebook.widgets import Explorer

LIB = Path(__file__).resolve().parents[1] / "course_lib"


def _templates() -> dict[str, str]:
    """Every literal first argument of tr(...) in course_lib (a string, or
    a module constant holding one), with the file it is in."""
    found = {}
    for path in sorted(LIB.rglob("*.py")):
        tree = ast.parse(path.read_text())
        consts = {n.targets[0].id: n.value.value for n in ast.walk(tree)
                  if isinstance(n, ast.Assign) and len(n.targets) == 1
                  and isinstance(n.targets[0], ast.Name)
                  and isinstance(n.value, ast.Constant)
                  and isinstance(n.value.value, str)}
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and node.args
                    and getattr(node.func, "id", None) == "tr"):
                continue
            arg = node.args[0]
            options = [arg.body, arg.orelse] if isinstance(arg, ast.IfExp) \
                else [arg]
            for a in options:
                if isinstance(a, ast.Constant):
                    found[a.value] = path.name
                elif isinstance(a, ast.Name) and a.id in consts:
                    found[consts[a.id]] = path.name
    return found


def _fields(template: str) -> set[str]:
    return {f for _, f, _, _ in string.Formatter().parse(template) if f}


@pytest.fixture
def zh():
    set_language("zh")
    yield
    set_language("en")


def test_every_library_message_has_a_chinese_template_with_its_fields():
    templates = _templates()
    assert len(templates) > 50                # the scan finds them
    ui = catalog("zh")
    missing = [t for t in templates if t not in ui]
    assert missing == []
    for t in templates:
        assert _fields(ui[t]) == _fields(t), t


def test_default_is_english_and_bad_language_is_a_value_error():
    assert get_language() == "en"
    assert tr("Check") == "Check"
    assert tr("Correct: {value}.", value=3) == "Correct: 3."
    assert tr("no {braces} filled") == "no {braces} filled"
    with pytest.raises(ValueError, match=r"language must be one of "
                                         r"\('en', 'zh'\), got 'fr'"):
        set_language("fr")
    assert get_language() == "en"


def test_numeric_exercise_in_chinese(zh):
    ex = NumericExercise(key="t-num", purpose="application", prompt="What is $1 + 1$?", answer=2,
                         mistakes=[(1, "Count again.")], hint="Add.",
                         solution="$1 + 1 = 2$.")
    assert ex.check("2").message == "正确：2。"
    assert ex.check("3").message == "不正确：3 太大了。看看提示吧。"
    assert ex.check("1").message == "不完全对。Count again."   # no entry
    assert ex.check("abc").message.startswith("无法使用的答案：'abc' 不是一个数")
    page = ex.static_html()
    # a bold heading: a Chinese heading takes no full stop
    assert "<strong>练习</strong>" in page and ">检查</button>" in page
    assert "<summary>解答</summary>" in page      # sphinx-exercise's word
    assert 'aria-label="练习 t-num 的答案"' in page   # space at Latin text
    assert "<summary>提示</summary>" in page and '"large": "不正确' in page


def test_chapter_strings_are_looked_up_by_their_english_text(zh,
                                                             monkeypatch):
    monkeypatch.setitem(catalog("zh"), "Pick the larger one.", "选较大的。")
    monkeypatch.setitem(catalog("zh"), "two", "二")
    ex = ChoiceExercise(key="t-choice", purpose="application", prompt="Pick the larger one.",
                        options=["one", "two"], answer=1,
                        explanations=["", "Yes."], hint="Count.",
                        solution="Two.")
    assert ex.check(1).message == "正确。Yes."
    assert ex.check(0).message == "不是这个。看看提示吧。"
    assert ex.check(None).message == "请先选择一个选项。"
    page = ex.static_html()
    assert "选较大的。" in page and "> 二</label>" in page
    assert ex.check("two").correct          # the value stays the English


def test_function_exercise_feedback_in_chinese(zh):
    ex = DiagnosedFunctionExercise(
        key="t-fn",
        purpose="application", prompt="Write `double(x)`.", func_name="double",
        starter_code="def double(x):\n    ...\n", reference=lambda x: 2 * x,
        cases=[((3,), {})], hint="Multiply.", solution="`2 * x`",
        mistakes=[(lambda x: x + 2, "you added 2")])
    assert ex.check("def double(x):\n    return 2 * x\n").message == \
        "全部 1 个用例都通过了。"
    wrong = ex.check("def double(x):\n    return x + 2\n").message
    assert wrong == "用例 1，`double(3)`：应为 6，得到的是 5。 可能的错误：you added 2"
    assert ex.diagnose((3,), {}, 5) == "you added 2"
    assert ex.check("def twice(x):\n    return x\n").message == \
        "请定义一个名为 `double` 的函数。"
    assert "检查代码需要 Python" in ex.static_html()


def test_function_exercise_timeout_message_in_chinese(zh):
    ex = FunctionExercise(key="t-loop", purpose="application", prompt="p", func_name="f",
                          starter_code="def f():\n    ...\n",
                          reference=lambda: 1, cases=[((), {})], hint="h",
                          solution="s", time_limit=0.2)
    msg = ex.check("def f():\n    while True:\n        pass\n").message
    assert msg.startswith("用例 1，`f()`：你的函数没有在 0.2 秒内结束")


def test_explorer_title_labels_and_note_in_chinese(zh, monkeypatch):
    monkeypatch.setitem(catalog("zh"), "Decay", "衰减")
    monkeypatch.setitem(catalog("zh"), "rate", "速率")

    def draw(fig, r):
        fig.add_subplot().plot([0, 1], [1, r])

    ex = Explorer(key="t-exp", title="Decay", draw=draw,
                  controls={"r": [0.5, 0.9]}, labels={"r": "rate"},
                  figsize=(3, 2), dpi=40)
    page = ex.static_html()
    assert "<strong>衰减</strong>" in page and 'aria-label="速率"' in page
    assert 'alt="衰减（交互式图）"' in page and "预先渲染" in page


def test_environment_variable_chooses_the_language(monkeypatch):
    monkeypatch.setenv("COURSE_LANGUAGE", "zh")
    import importlib
    # a reload makes new functions (and a new catalogue cache); other
    # modules and tests hold the old ones, so they are put back after
    before = dict(vars(i18n))
    fresh = importlib.reload(i18n)
    try:
        assert fresh.get_language() == "zh"
    finally:
        vars(i18n).update(before)
        i18n.set_language("en")      # and the figures' font back
