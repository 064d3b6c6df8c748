"""Inline formulas that the Markdown parser breaks apart.

A ``$...$`` formula may wrap over lines in a chapter's markdown, but a
continuation line that starts with ``- ``, ``+ ``, ``* `` or ``1. `` is
read as a new list item before MathJax ever sees the formula: the reader
gets raw TeX and a stray bullet (chapter 1's learning goals showed
``$h_t = \\tanh(...`` and a bullet "b_{hh})$ as a loop"). The strict build
does not warn about it. This test finds such lines; the fix is to move
the operator to the end of the previous line.
"""
import re

from notebook_support import book_texts

LIST_START = re.compile(r"\s*(?:[-+*]|\d+[.)])\s")


def broken_formulas(text: str) -> list[str]:
    """Lines of markdown ``text`` that start like a list item while an
    inline ``$`` formula opened on an earlier line is still open."""
    found, open_math, fence = [], False, False
    for line in text.split("\n"):
        if line.lstrip().startswith(("```", "~~~")):
            fence = not fence
            continue
        if fence:
            continue
        if not line.strip():
            open_math = False          # a paragraph ends any formula
            continue
        if open_math and LIST_START.match(line):
            found.append(line.strip()[:60])
        if line.replace("\\$", "").replace("$$", "").count("$") % 2:
            open_math = not open_math
    return found


def test_checker_finds_a_wrapped_formula_read_as_a_list():
    assert broken_formulas("- the sum $a\n  + b$ of two") == ["+ b$ of two"]
    assert broken_formulas("so $J = (I\n- x x^T)$ here") == ["- x x^T)$ here"]
    assert broken_formulas("- $a$ one\n- $b$ two") == []
    assert broken_formulas("$$\na\n- b\n$$") == []
    assert broken_formulas("costs \\$5 or\n- more") == []
    assert broken_formulas("```\nx = $a\n- b\n```") == []


def test_no_formula_is_split_by_a_list_marker():
    problems = [f"{where}: {line!r}" for where, text in book_texts("markdown")
                for line in broken_formulas(text)]
    assert not problems, "\n".join(problems)
