"""How the Chinese prose reads: the rules of style a script can check.

The Chinese text of every chapter (``course_lib/notebook/locale/zh/
<chapter>.json``, ``cells``) and of the intro follows three rules of
Chinese textbook prose that are easy to break again when a cell is
retranslated:

* a cross-reference that renders as a section title is quoted,
  ``“{ref}`ch03-qkv`”一节``: without the quotation marks the title runs
  into the sentence ("这就是查询、键和值一节所说的…" reads like a list).
  A reference whose own text names the section (``{ref}`方差一节 <...>```)
  is written as the quoted bare reference instead;
* full-width parentheses do not nest (outside maths and code): write
  "（前归一化块、RMSNorm、…）", not "（前归一化（pre-norm）块、…）";
* a chapter's title and its italic opening summary carry no English gloss
  in parentheses: the English goes with a term's first use in the body;
* a reference whose section title has maths gives its own text, the
  maths in Unicode (Sphinx would print the title's TeX as typed);
* no sentence runs past 150 characters, a formula, code span, role or
  glued value counting as one (Chinese textbook prose runs 30 to 50
  characters a sentence; a long one is split at its joints). Table rows
  and the Colab badge's link are not sentences.

Each rule is a small function, tested first on made-up text so that each
check is seen to fail when it should, then run over every chapter.
"""
import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location(
    "zh_translations", ROOT / "scripts" / "zh_translations.py")
zt = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(zt)

CHAPTERS = sorted(zt.BOOK.glob("ch*.ipynb"))
PAGES = CHAPTERS + [zt.BOOK / "intro.md"]

# what is not prose: code blocks (not MyST directives such as
# ```{exercise}, whose body is prose), display and inline maths, code spans
# (and the bodies of roles, which are written between backticks too)
_HIDDEN = re.compile(r"^```(?!\{)[^\n]*\n.*?^```|\$\$.+?\$\$|\$[^$\n]+?\$"
                     r"|`[^`\n]*`", re.S | re.M)
_REF = re.compile(r"\{ref\}`([^`]*)`")
_HEADING = re.compile(r"^\(([\w:.-]+)\)=[ \t]*\n#+[ \t]+(.+?)[ \t]*$", re.M)
_CJK = re.compile("[\u3400-\u4dbf\u4e00-\u9fff]")


def chinese_cells(page: Path) -> list[tuple[str, str]]:
    """``(cell id, Chinese text)`` of a page's translated cells, in the
    English page's order."""
    cells = zt.load(page)["cells"]
    return [(cid, cells[cid]["zh"]) for cid in zt.english_cells(page)
            if cid in cells and cells[cid].get("zh")]


def prose(text: str) -> str:
    """``text`` with code blocks, maths and code spans blanked out (same
    length, so positions still match)."""
    return _HIDDEN.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)


def section_titles(texts) -> dict[str, str]:
    """{label: heading text} of every ``(label)=`` followed by a heading."""
    return {m.group(1): m.group(2) for text in texts
            for m in _HEADING.finditer(text)}


def bare_section_refs(text: str, titles: dict[str, str]) -> list[str]:
    """The ``{ref}`` roles of ``text`` that render a section's name
    without quotation marks: to a label in ``titles``, with no text of
    their own (Sphinx writes the heading) or with the heading as their
    text, not between “ and ”; and the ones whose own text names the
    section ("…一节"), which should be the quoted bare reference."""
    found = []
    for m in _REF.finditer(text):
        body = m.group(1)
        target = re.fullmatch(r"(.*?)\s*<([^<>]+)>", body, re.S)
        own, label = (target.group(1), target.group(2)) if target else (
            None, body)
        if label not in titles:
            continue
        where = text[max(0, m.start() - 12):m.end() + 6]
        if own is not None and own.endswith("一节"):
            found.append(f"section named in the role's text: {where!r}")
        elif own is None or own == titles[label]:
            quoted = (text[m.start() - 1:m.start()] == "“"
                      and text[m.end():m.end() + 1] == "”")
            if not quoted:
                found.append(f"unquoted section title: {where!r}")
    return found


def refs_to_titles_with_maths(text: str, titles: dict[str, str]
                              ) -> list[str]:
    """The ``{ref}`` roles of ``text`` with no text of their own whose
    section title has maths: Sphinx writes the title's TeX as typed in
    the link ("为什么要除以 \\sqrt{d_k}"), so the role must give its own
    text, the maths in Unicode ("为什么要除以 √d_k")."""
    return [m.group(0) for m in _REF.finditer(text)
            if "$" in titles.get(m.group(1), "")]


LONG_SENTENCE = 150
# one unit to a reader: a formula, a code span or role, a glued value
_UNIT = re.compile(r"\$\$.*?\$\$|\$[^$]*\$|\{\w+(?::\w+)?\}`[^`]*`|`[^`]*`"
                   r"|<!--glue:[^>]*-->.*?<!--/glue-->", re.S)


def long_sentences(text: str, limit: int = LONG_SENTENCE) -> list[str]:
    """The sentences of ``text`` (ended by 。！？ or a line break) longer
    than ``limit`` characters, a unit of :data:`_UNIT` counting as one;
    table rows and lines that open with an image link are left out."""
    found = []
    for line in _UNIT.sub("X", text).splitlines():
        if line.lstrip().startswith(("|", "[![")):
            continue
        found += [s for s in re.split(r"(?<=[。！？])", line)
                  if len(s.strip()) > limit]
    return found


def nested_parentheses(text: str) -> list[str]:
    """Each place in ``text``'s prose where a full-width parenthesis opens
    inside another."""
    found, depth, start = [], 0, 0
    plain = prose(text)
    for i, ch in enumerate(plain):
        if ch == "（":
            depth += 1
            if depth == 1:
                start = i
            elif depth == 2:
                found.append(text[start:i + 20])
        elif ch == "）":
            depth = max(0, depth - 1)
    return found


def english_glosses(line: str) -> list[str]:
    """The full-width parentheses of ``line``'s prose that hold Latin
    letters and no Chinese character: English glosses such as
    "（KV cache）" (not "（包括 YaRN 位置缩放）", not maths or code)."""
    plain = prose(line)
    return [line[m.start():m.end()]
            for m in re.finditer(r"（[^（）]*）", plain)
            if re.search("[A-Za-z]", m.group(0))
            and not _CJK.search(m.group(0))]


def opening(page: Path) -> list[str]:
    """The title line and the italic summary line of a chapter (the first
    cell: ``# title``, then ``*summary*``)."""
    _, text = chinese_cells(page)[0]
    lines = [ln for ln in text.splitlines() if ln.strip()]
    title = [ln for ln in lines if ln.startswith("# ")]
    summary = [ln for ln in lines if re.fullmatch(r"\*[^*].*[^*]\*", ln)]
    return title[:1] + summary[:1]


# ------------------------------------------------ the checks on made-up text
def test_bare_section_refs_on_made_up_text():
    titles = {"sec": "查询、键和值"}
    assert bare_section_refs("这就是{ref}`sec`所说的。", titles)
    assert bare_section_refs("见 {ref}`sec` 一节。", titles)
    assert bare_section_refs("见“{ref}`sec`一节。", titles)   # one mark
    assert bare_section_refs("见{ref}`方差一节 <sec>`。", titles)
    assert bare_section_refs("见{ref}`查询、键和值 <sec>`。", titles)
    assert bare_section_refs("这就是“{ref}`sec`”一节所说的。", titles) == []
    assert bare_section_refs("“{ref}`查询、键和值 <sec>`”", titles) == []
    # own words that are not the section's name, and labels of figures
    # or exercises (no heading), read as part of the sentence
    assert bare_section_refs("{ref}`后文 <sec>`会比较两者。", titles) == []
    assert bare_section_refs("见 {ref}`fig-1`。", titles) == []
    assert section_titles(["(sec)=\n## 查询、键和值\n\n正文", "(fig-1)=\n正文"]
                          ) == {"sec": "查询、键和值"}


def test_refs_to_titles_with_maths_on_made_up_text():
    titles = {"ch03-variance": "为什么要除以 $\\sqrt{d_k}$", "ch03-x": "缩放"}
    text = ("见“{ref}`ch03-variance`”一节与“{ref}`ch03-x`”一节，以及"
            "“{ref}`为什么要除以 √d_k <ch03-variance>`”一节")
    assert refs_to_titles_with_maths(text, titles) == [
        "{ref}`ch03-variance`"]


def test_long_sentences_on_made_up_text():
    unit = "$\\sum_{i=1}^{n} x_i^2$ 与 `torch.nn.functional.softmax` "
    assert long_sentences("短句。" + unit * 5 + "。", limit=60) == []
    long = "很" * 61 + "长。"
    assert long_sentences("短句。" + long + "又一句。", limit=60) == [long]
    assert long_sentences("| " + "表" * 70 + " |", limit=60) == []


def test_nested_parentheses_on_made_up_text():
    assert nested_parentheses("架构（前归一化（pre-norm）块、RMSNorm）。")
    assert len(nested_parentheses("（a（b）c（d）e）。（f）")) == 2
    assert nested_parentheses("编码（absolute，见第 2 章）和（KV cache）。") == []
    assert nested_parentheses("公式 $f（（x））$ 和代码 `g（（y））`。") == []
    assert nested_parentheses("```python\nprint（（1））\n```\n正文") == []


def test_english_glosses_on_made_up_text():
    assert english_glosses("# 键值缓存（KV cache）") == ["（KV cache）"]
    assert english_glosses("*前馈网络（feed-forward network，FFN）*")
    assert english_glosses("*本章（包括 YaRN 位置缩放）比较 $（x）$*") == []
    assert english_glosses("（`q_lora_rank`）") == []


# --------------------------------------------------------- the whole book
TITLES = section_titles(text for page in PAGES
                        for _, text in chinese_cells(page))


def _ids(page: Path) -> str:
    return page.stem[:4]


@pytest.mark.parametrize("page", PAGES, ids=_ids)
def test_section_references_are_quoted(page):
    assert TITLES, "no section labels found"
    found = [f"{cid}: {ref}" for cid, text in chinese_cells(page)
             for ref in bare_section_refs(text, TITLES)]
    assert found == [], "write “{ref}`label`”一节:\n" + "\n".join(found)


@pytest.mark.parametrize("page", PAGES, ids=_ids)
def test_no_reference_shows_a_titles_tex(page):
    found = [f"{cid}: {ref}" for cid, text in chinese_cells(page)
             for ref in refs_to_titles_with_maths(text, TITLES)]
    assert found == [], ("give the role its own text, maths in Unicode:\n"
                         + "\n".join(found))


@pytest.mark.parametrize("page", PAGES, ids=_ids)
def test_no_sentence_runs_past_150_characters(page):
    found = [f"{cid}: {len(x)}: {x[:60]}…" for cid, text in
             chinese_cells(page) for x in long_sentences(text)]
    assert found == [], "split at its joints:\n" + "\n".join(found)


@pytest.mark.parametrize("page", PAGES, ids=_ids)
def test_no_nested_fullwidth_parentheses(page):
    found = [f"{cid}: {place!r}" for cid, text in chinese_cells(page)
             for place in nested_parentheses(text)]
    assert found == [], "\n".join(found)


@pytest.mark.parametrize("page", CHAPTERS, ids=_ids)
def test_title_and_opening_summary_carry_no_english_gloss(page):
    lines = opening(page)
    assert len(lines) == 2, f"title and summary not found: {lines}"
    found = [g for line in lines for g in english_glosses(line)]
    assert found == [], f"gloss the term at its first use in the body: {found}"
