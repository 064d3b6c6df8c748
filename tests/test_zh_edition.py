"""The Chinese edition is the English book in Chinese.

``zh/book/`` is written by ``scripts/build_zh.py`` (``make zh``). These
tests hold it to the English book, which nbval checks:
- each Chinese notebook has the English cells in the same order, plus one
  cell that selects the language;
- every code cell is the English source, character for character (but
  for the Colab title of an exercise cell, in Chinese);
- every text output (printed text, ``text/plain``) is what the English
  run printed, except in cells whose output nbval ignores (timings);
- the markdown is the current translation, and the exercises were run in
  Chinese (their pages say 练习, not Exercise, and show the starter code
  of function exercises with its comments in Chinese: the code cell that
  builds the exercise is the English one, and the starter code in it
  keeps its English comments, which ``tr`` replaces when it is shown);
- ``zh/_config.yml`` and ``zh/_toc.yml`` are what the English ones give,
  and the book's chrome (dropdown hints, author, search box, the theme's
  buttons) is Chinese.
So an English chapter re-executed, or a translation edited, without
``make zh`` fails here.
"""
import ast
import gettext
import html
import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest
import yaml

from course_lib.notebook.code_comments import translate_comments

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
_spec = importlib.util.spec_from_file_location(
    "build_zh", ROOT / "scripts" / "build_zh.py")
bz = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bz)
zt = bz.zt

CHAPTERS = sorted((ROOT / "book").glob("ch*.ipynb"))


def _texts(cell: dict) -> list[str]:
    """Printed text and text/plain of a code cell's outputs. Consecutive
    stream outputs are joined: how a kernel splits one print into stream
    messages depends on timing (nbval joins them too)."""
    out = []
    for o in cell.get("outputs", []):
        if o["output_type"] == "stream":
            text = f"{o['name']}: {''.join(o['text'])}"
            if out and out[-1].startswith(f"{o['name']}: "):
                text = out.pop() + "".join(o["text"])
            out.append(text)
        elif o["output_type"] == "error":
            out.append(f"error: {o['ename']}")
        elif "text/plain" in o.get("data", {}):
            out.append("".join(o["data"]["text/plain"]))
    return out


def _starter_codes(cell: dict) -> list[str]:
    """The starter code of each function exercise a code cell builds."""
    source = "".join(cell["source"])
    if "starter_code" not in source:
        return []
    return [zt._constant(kw.value, {}) for node in ast.walk(ast.parse(source))
            for kw in getattr(node, "keywords", [])
            if kw.arg == "starter_code"]


def _html(cell: dict) -> str:
    return "".join("".join(o.get("data", {}).get("text/html", ""))
                   for o in cell.get("outputs", []))


@pytest.mark.parametrize("english", CHAPTERS, ids=lambda p: p.stem[:4])
def test_chinese_notebook_is_the_english_one_in_chinese(english):
    zh_path = ROOT / "zh" / "book" / english.name
    assert zh_path.exists(), "run `make zh`"
    en = json.loads(english.read_text())["cells"]
    zh = json.loads(zh_path.read_text())["cells"]
    language = [c for c in zh if c.get("id") == "zh-language"]
    assert len(language) == 1
    assert "".join(language[0]["source"]) == bz.LANGUAGE_CELL
    assert "remove-cell" in language[0]["metadata"]["tags"]
    zh = [c for c in zh if c.get("id") != "zh-language"]
    assert [(c["id"], c["cell_type"]) for c in zh] == \
        [(c["id"], c["cell_type"]) for c in en]
    translations = zt.load(english)["cells"]
    strings = zt.load(english).get("strings", {})
    for e, z in zip(en, zh):
        where = f"{english.stem} cell {e['id']}"
        if e["cell_type"] == "markdown":
            assert zt.without_glued_values("".join(z["source"])) == \
                zt.without_glued_values(bz.chinese(translations[e["id"]])), \
                f"{where}: run `make zh`"
            continue
        assert z["source"] == bz.zh_code(e["source"]), where
        assert z["metadata"].get("tags", []) == \
            e["metadata"].get("tags", []), where
        for _, key, field, text in zt.figure_texts(e):   # captions, alt
            got = z["metadata"]["mystnb"][key][field]
            assert got == bz.join_cjk_lines(strings[text]), where
        if "nbval-ignore-output" not in e["metadata"].get("tags", []):
            assert _texts(z) == _texts(e), f"{where}: run `make zh`"
        if "<strong>Exercise.</strong>" in _html(e):
            assert "<strong>练习</strong>" in _html(z), where
        for code in _starter_codes(e):                   # their comments
            shown = translate_comments(code, lambda t: strings.get(t) or t)
            assert html.escape(shown) in _html(z), f"{where}: run `make zh`"


def test_every_exercise_and_explorer_string_has_a_translation():
    for english in CHAPTERS:
        strings = zt.load(english).get("strings", {})
        missing = [t for t in zt.reader_strings(english)
                   if not strings.get(t)]
        assert missing == [], english.stem


def test_book_chrome_is_chinese():
    # what every page shows around the chapter: the solution dropdowns'
    # hint, the footer's author, the search box, the theme's buttons
    config = yaml.safe_load(bz.config_texts()["_config.yml"])
    sphinx = config["sphinx"]["config"]
    texts = [config["author"], sphinx["togglebutton_hint"],
             sphinx["togglebutton_hint_hide"],
             *sphinx["ti_messages"].values()]
    assert all(re.search(f"[{bz._CJK}]", t) for t in texts), texts
    assert config["sphinx"]["local_extensions"]["theme_messages"] == \
        "book/_ext"
    assert {"Search this book...", "Toggle primary sidebar", "Color mode",
            "Launch interactive content",
            "Print to PDF"} <= set(sphinx["ti_messages"])
    assert sphinx["ti_messages"]["Print to PDF"] == "打印为 PDF"  # not 列印成


def test_theme_messages_come_before_the_themes_catalogues():
    spec = importlib.util.spec_from_file_location(
        "theme_messages", ROOT / "book" / "_ext" / "theme_messages.py")
    tm = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tm)

    class Theme(gettext.NullTranslations):      # a theme's catalogue
        def gettext(self, message):
            return {"Color mode": "", "Search": "搜索"}.get(message, message)

    t = tm.Messages({"Color mode": "颜色模式"}, Theme())
    assert t.gettext("Color mode") == "颜色模式"
    assert t.gettext("Search") == "搜索" and t.gettext("Other") == "Other"
    assert t.ngettext("Color mode", "Color modes", 1) == "颜色模式"
    # names the templates write without gettext, after the build
    page = ('<button title="Toggle primary sidebar"><nav aria-label="Page">'
            '<img alt="Page 2"><p title="Page">Page</p>')
    assert tm.translate_attributes(page, {"Toggle primary sidebar": "导航",
                                          "Page": "本页"}) == (
        '<button title="导航"><nav aria-label="本页">'
        '<img alt="Page 2"><p title="本页">Page</p>')


@pytest.mark.parametrize("name", ["_config.yml", "_toc.yml"])
def test_book_config_follows_the_english_one(name):
    assert (ROOT / "zh" / name).read_text() == bz.config_texts()[name], \
        "run `make zh`"


def test_search_dictionary_holds_the_glossary_terms():
    terms = (ROOT / "zh" / "search_terms.txt").read_text().splitlines()
    assert terms == bz.search_terms().splitlines(), "run `make zh`"
    assert {"注意力", "键值缓存", "混合专家模型"} <= set(terms)


@pytest.mark.parametrize("page", zt.PAGES)
def test_translated_pages_are_current(page):
    data = bz.complete(ROOT / "book" / f"{page}.md")
    target = ROOT / "zh" / "book" / f"{page}.md"
    assert data is not None, f"book/{page}.md is not fully translated"
    assert target.read_text() == bz.chinese(data["cells"]["page"])


def test_join_cjk_lines_keeps_code_maths_and_latin_breaks():
    text = ("注意力把\n查询和键\nmatched\n词元。\n\n```python\n# 中\n# 文\n"
            "```\n$$\n中\n文\n$$\n")
    assert bz.join_cjk_lines(text) == (
        "注意力把查询和键\nmatched\n词元。\n\n```python\n# 中\n# 文\n```\n"
        "$$\n中\n文\n$$\n")


def test_badge_points_at_the_chinese_notebook():
    en = ("[![Open In Colab](images/colab-badge.svg)](https://colab."
          "research.google.com/github/o/r/blob/main/book/ch01_x.ipynb)")
    assert bz.zh_badge(en).endswith("/blob/main/zh/book/ch01_x.ipynb)")
    assert bz.zh_badge(en).startswith("[![在 Colab 中打开](")


def test_build_zh_refuses_an_unknown_chapter_prefix(capsys):
    # `make zh ZH=...` writes only the named chapters and pages; a typo
    # must stop before anything is written
    with pytest.raises(SystemExit):
        bz.main(["ch99"])
    assert "no chapter or page starts with ['ch99']" in capsys.readouterr().err
