"""The Chinese edition's translations stay in step with the English.

Each translated markdown cell records the hash of the English text it
translates; editing the English cell without updating the translation
fails ``test_translations_match_the_english``. The other tests run the
same checker on a small made-up book, to show that it fails when it
should.
"""
import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location(
    "zh_translations", ROOT / "scripts" / "zh_translations.py")
zt = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(zt)

CHAPTERS = zt.sources()            # the chapters, intro.md, glossary.md


@pytest.mark.parametrize("notebook", CHAPTERS, ids=lambda p: p.stem[:4])
def test_translations_match_the_english(notebook):
    assert (ROOT / "course_lib" / "notebook" / "locale" / "zh" /
            f"{notebook.stem}.json").exists(), "run export"
    assert zt.problems(notebook) == []


# ------------------------------------------------- the checker on a toy book
def _notebook(cells):
    return {"cells": [
        {"cell_type": kind, "id": cid, "metadata": {}, "source": text,
         **({"outputs": [], "execution_count": None}
            if kind == "code" else {})}
        for cid, kind, text in cells],
        "metadata": {}, "nbformat": 4, "nbformat_minor": 5}


EXERCISE = ('NumericExercise(key="toy-1", purpose="application", prompt="What is $1 + 1$?", '
            'answer=2, mistakes=[(1, "Count again.")], hint="Add.", '
            'solution="$1 + 1 = 2$.")')


@pytest.fixture
def toy(tmp_path, monkeypatch):
    book, zh = tmp_path / "book", tmp_path / "zh"
    book.mkdir()
    nb = book / "ch99_toy.ipynb"
    nb.write_text(json.dumps(_notebook([
        ("a1", "markdown", "(toy-start)=\n# Attention\n\nScores $QK^\\top$ "
                           "and `softmax`, see {ref}`toy-start`.\n"),
        ("c1", "code", EXERCISE),
        ("a2", "markdown", "A second cell."),
    ])))
    monkeypatch.setattr(zt, "BOOK", book)
    monkeypatch.setattr(zt, "ZH", zh)
    zt.export("ch99")
    translation = tmp_path / "t.txt"
    translation.write_text(
        "=== cell a1\n(toy-start)=\n# 注意力\n\n分数 $QK^\\top$ 与 "
        "`softmax`，见 {ref}`开头 <toy-start>`。\n\n=== cell a2\n第二个单元。\n"
        "\n=== string 0\n$1 + 1$ 等于多少？\n")
    zt.import_file("ch99", str(translation))
    return nb


def _edit_english(nb, cid, text):
    data = json.loads(nb.read_text())
    for c in data["cells"]:
        if c["id"] == cid:
            c["source"] = text
    nb.write_text(json.dumps(data))


def test_toy_translation_is_in_sync(toy):
    assert zt.problems(toy) == []
    data = zt.load(toy)
    assert list(data["strings"]) == ["What is $1 + 1$?", "Count again.",
                                     "Add.", "$1 + 1 = 2$."]
    assert data["strings"]["What is $1 + 1$?"] == "$1 + 1$ 等于多少？"
    assert data["strings"]["Add."] is None          # not translated yet


def test_editing_an_english_cell_makes_its_translation_stale(toy, capsys):
    _edit_english(toy, "a2", "A second cell, edited.")
    found = zt.problems(toy)
    assert len(found) == 1 and "cell a2: stale" in found[0]
    zt.stale(["ch99"])
    assert "+A second cell, edited." in capsys.readouterr().out
    zt.accept("ch99", "a2")                         # after retranslating
    assert zt.problems(toy) == []


def test_export_shows_an_untranslated_cell_as_the_english_is_now(toy):
    data = json.loads(toy.read_text())
    data["cells"].append({"cell_type": "markdown", "id": "a3",
                          "metadata": {}, "source": "Old text."})
    toy.write_text(json.dumps(data))
    zt.export("ch99")
    _edit_english(toy, "a3", "New text.")
    zt.export("ch99")             # not translated yet: refreshed, not stale
    entry = zt.load(toy)["cells"]["a3"]
    assert entry["en"] == "New text." and entry["zh"] is None
    assert entry["en_sha"] == zt.sha("New text.")
    _edit_english(toy, "a2", "A second cell, edited.")
    zt.export("ch99")             # translated: kept, and reported stale
    assert zt.load(toy)["cells"]["a2"]["en"] == "A second cell."
    assert any("cell a2: stale" in p for p in zt.problems(toy))


def test_editing_an_exercise_string_makes_its_translation_stale(toy):
    data = json.loads(toy.read_text())
    data["cells"][1]["source"] = EXERCISE.replace("What is", "Compute")
    toy.write_text(json.dumps(data))
    found = zt.problems(toy)
    assert len(found) == 1 and "string 'What is $1 + 1$?': stale" in found[0]


@pytest.mark.parametrize("zh, kind", [
    ("(toy-start)=\n# 注意力\n\n分数 $QK^T$ 与 `softmax`，见 "
     "{ref}`开头 <toy-start>`。\n", "math"),
    ("# 注意力\n\n分数 $QK^\\top$ 与 `softmax`，见 "
     "{ref}`开头 <toy-start>`。\n", "labels"),
    ("(toy-start)=\n# 注意力\n\n分数 $QK^\\top$ 与 `softmax`，见 "
     "{ref}`开头 <toy-end>`。\n", "roles"),
    ("(toy-start)=\n# 注意力\n\n分数 $QK^\\top$ 与 `归一化`，见 "
     "{ref}`开头 <toy-start>`。\n", "code"),
], ids=["math", "labels", "roles", "code"])
def test_a_translation_that_changes_math_labels_roles_or_code_fails(
        toy, tmp_path, zh, kind):
    bad = tmp_path / "bad.txt"
    bad.write_text(f"=== cell a1\n{zh}")
    zt.import_file("ch99", str(bad))
    found = zt.problems(toy)
    assert len(found) == 1 and f"{kind} differ" in found[0]


def test_import_refuses_unknown_sections(toy, tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_text("=== cell nope\n文字\n")
    with pytest.raises(SystemExit, match="no cell nope"):
        zt.import_file("ch99", str(bad))
    bad.write_text("=== string 9\n文字\n")
    with pytest.raises(SystemExit, match=r"string 9 out of range \(0..3\)"):
        zt.import_file("ch99", str(bad))


# ------------------------------------------------------ words inside maths
CASES = (r"$$M_{ij} = \begin{cases} 0 & \text{if query } i "
         r"\text{ may read key } j,\\ -\infty & \text{otherwise.}"
         r"\end{cases}$$ and $d_{\text{model}} = 512$")
ZH_CASES = (r"$$M_{ij} = \begin{cases} 0 & \text{若查询 } i "
            r"\text{ 可以读取键 } j,\\ -\infty & \text{否则。}"
            r"\end{cases}$$ 且 $d_{\text{model}} = 512$")


def test_words_inside_maths_may_be_translated():
    assert zt._differences(CASES, ZH_CASES) == []
    assert zt._differences(CASES, CASES) == []        # or left as they are
    flops = r"$$\underbrace{2T}_{\text{2 FLOPs per weight per token}}$$"
    assert zt._differences(
        flops, r"$$\underbrace{2T}_{\text{每个参数每个词元 2 次浮点运算}}$$") == []


@pytest.mark.parametrize("bad, kind", [
    # a symbol, a number, a command, a text argument more or less
    (ZH_CASES.replace(r"0 & \text{若", r"1 & \text{若"), "math"),
    (ZH_CASES.replace(r"\text{ 可以读取键 } j", r"\text{ 可以读取键 } k"),
     "math"),
    (ZH_CASES.replace("= 512", "= 256"), "math"),
    (ZH_CASES.replace(r"\text{否则。}", r"\mathrm{否则。}"), "math"),
    (ZH_CASES.replace(r"\text{ 可以读取键 } j", r" 可以读取键 j"), "math"),
    # a number inside the words
    (r"$$\underbrace{2T}_{\text{每个参数每个词元 4 次浮点运算}}$$",
     "math"),
    # a word left in English but changed: a notation, not a translation
    (ZH_CASES.replace(r"d_{\text{model}}", r"d_{\text{modle}}"),
     "math words"),
], ids=["symbol", "index", "number", "command", "text dropped",
        "number in words", "word changed"])
def test_a_changed_symbol_or_number_in_maths_still_fails(bad, kind):
    english = CASES if "FLOP" not in bad and "浮点" not in bad else \
        r"$$\underbrace{2T}_{\text{2 FLOPs per weight per token}}$$"
    found = zt._differences(english, bad)
    assert len(found) == 1 and found[0].startswith(f"{kind} differ"), found


def test_chinese_notebooks_path_stands_for_the_english_one():
    en = "Open the notebooks in `book/` with Jupyter."
    assert zt._differences(en, "用 Jupyter 打开 `zh/book/` 中的 notebook。") == []
    assert zt._differences(en, "用 Jupyter 打开 `zh/` 中的 notebook。") != []


# ------------------------------------------------- starter-code comments
STARTER = ('FunctionExercise(key="toy-2", purpose="application", '
           'prompt="Write `f`.", func_name="f", '
           'starter_code="def f(x):\\n    # 1) double it\\n'
           '    return x  # (B, T)\\n", reference=abs, cases=[], '
           'hint="Double.", solution="`2 * x`")')


def test_starter_code_comments_are_strings_to_translate(toy):
    data = json.loads(toy.read_text())
    data["cells"][1]["source"] = STARTER
    toy.write_text(json.dumps(data))
    # in the order of the keywords; the shape comment is notation
    assert zt.reader_strings(toy) == ["Write `f`.", "1) double it",
                                      "Double.", "`2 * x`"]


def test_every_starter_code_comment_reads_in_chinese():
    # what a Chinese learner sees in an exercise's box: every comment that
    # is prose holds Chinese (the translation is in the chapter's strings)
    from course_lib.notebook.code_comments import comment_texts, \
        translate_comments
    import ast
    seen = 0
    for notebook in CHAPTERS:
        if notebook.suffix != ".ipynb":
            continue
        strings = zt.load(notebook).get("strings", {})
        for cell in json.loads(notebook.read_text())["cells"]:
            if cell["cell_type"] != "code" or "starter_code" not in \
                    "".join(cell["source"]):
                continue
            for node in ast.walk(ast.parse("".join(cell["source"]))):
                for kw in getattr(node, "keywords", []):
                    if kw.arg != "starter_code":
                        continue
                    code = zt._constant(kw.value, {})
                    shown = translate_comments(
                        code, lambda t: strings.get(t) or t)
                    english = [c for c in comment_texts(shown)
                               if not zt._CJK_CHAR.search(c)]
                    assert english == [], notebook.stem
                    seen += len(comment_texts(code))
    assert seen > 50
