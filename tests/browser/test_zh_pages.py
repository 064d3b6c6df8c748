"""Every Chinese page as a Chinese reader meets it: no English outside
code, maths and names.

Each page of the built Chinese book (``zh/``) is used as a reader would:
every ``<details>`` opened (hints, solutions, hidden sources), every
explorer's slider moved through each of its values, every exercise
checked with nothing chosen, with each option, with a word, with each
value its checker recognises as a mistake, with the answer, and with
values too large and too small. Then the page is read as a browser
renders it: the text of every block of a rendered element (a paragraph,
a list item, a label, a feedback message...), code, maths, scripts and
form fields left out, and the attributes a reader or a screen reader
meets (``title``, ``aria-label``, ``aria-valuetext``, ``alt``,
``placeholder``) of rendered elements. ``zh_scan.english_words`` decides
which words fail (its module docstring says what a Chinese page may
show); a TeX command shown as typed (``\\sqrt`` in the text of a link
to a section whose title has maths) fails too.

Left out as names, like code: the citations and the bibliography (authors
and paper titles as published), and the English terms of the glossary
(a bilingual glossary shows them by design, and the index lists them).
Printed outputs are code (``<pre>``) and stay as the English run printed
them, as d2l-zh keeps its outputs; the intro says so.
"""
from __future__ import annotations

import pytest

from test_pages import PAGES, PREFIX
from zh_scan import READER_ATTRIBUTES, english_words, identifiers, raw_tex

pytestmark = pytest.mark.browser

ZH_PAGES = [p for p in PAGES if p.startswith(PREFIX["zh"])]

# What is read as code or names, not as prose (see the module docstring).
SKIP = ", ".join([
    "mjx-container", "code", "pre", "script", "style", "textarea",
    "noscript", "template",
    ".bibtex-citation", ".citation",          # citations, bibliography
    "dl.glossary > dt", ".genindextable",     # the glossary's terms
])

# Uses the page, then returns what it showed: {"texts": [...], "code":
# [the code of the page], "counts": {what was used: how many}}.
USE_AND_READ_JS = r"""async ([SKIP, ATTRS]) => {
    const texts = [];
    const counts = {details: 0, sliderValues: 0, checks: 0};
    const shown = (el) => el.checkVisibility({visibilityProperty: true});
    // The block a piece of text belongs to: its nearest ancestor that is
    // not laid out inline.
    const block = (el) => {
        while (el.parentElement) {
            const d = getComputedStyle(el).display;
            if (!d.startsWith('inline') || d === 'inline-block') break;
            el = el.parentElement;
        }
        return el;
    };
    // The text of each block a reader sees in ``root``: its own text
    // nodes and those of its inline descendants, in order, so that a
    // sentence is read whole.
    const read = (root) => {
        const blocks = new Map();
        const w = document.createTreeWalker(root, NodeFilter.SHOW_TEXT);
        while (w.nextNode()) {
            const n = w.currentNode, el = n.parentElement;
            if (!n.textContent.trim() || el.closest(SKIP) || !shown(el))
                continue;
            const b = block(el);
            if (!blocks.has(b)) blocks.set(b, []);
            blocks.get(b).push(n.textContent);
        }
        for (const parts of blocks.values()) texts.push(parts.join(''));
        for (const el of [root, ...root.querySelectorAll('*')]) {
            if (el.closest(SKIP) || !shown(el)) continue;
            for (const a of ATTRS) {
                const v = el.getAttribute(a);
                if (v && v.trim()) texts.push(v);
            }
        }
    };
    // The walk reads text, it does not render: the feedback of each Check
    // stays as TeX (left out as maths) instead of queueing hundreds of
    // typesets that the page's next test would wait for.
    const mj = window.MathJax;
    const typeset = mj && mj.typesetPromise;
    if (typeset) mj.typesetPromise = () => Promise.resolve();
    // hints, solutions, hidden cell sources
    document.querySelectorAll('details').forEach((d) => {
        d.open = true; counts.details++; });
    // every value of every slider
    for (const s of document.querySelectorAll(
            '.ti-explorer input[type=range]')) {
        const step = +s.step || 1;
        for (let v = +s.min; v <= +s.max; v += step) {
            s.value = v;
            s.dispatchEvent(new Event('input', {bubbles: true}));
            read(s.closest('.ti-explorer'));
            counts.sliderValues++;
        }
    }
    // every exercise with a Check button, with every kind of answer
    const check = (ex) => {
        ex.querySelector('.ti-check').click();
        counts.checks++;
        read(ex.querySelector('.ti-feedback'));
    };
    for (const ex of document.querySelectorAll('.ti-exercise')) {
        if (!ex.querySelector('.ti-check')) continue;
        check(ex);                                      // nothing given
        ex.querySelectorAll('input[type=radio]').forEach((r) => {
            r.checked = true;
            r.dispatchEvent(new Event('change', {bubbles: true}));
            check(ex);
        });
        const field = ex.querySelector('.ti-answer');
        if (!field) continue;
        const script = Array.from(ex.querySelectorAll('script'))
            .map((x) => x.textContent).find((t) => t.includes(' d = {'));
        const line = script.split('\n').find((l) => l.includes(' d = {'));
        const d = JSON.parse(line.slice(line.indexOf(' d = {') + 5,
                                        line.lastIndexOf(';')));
        const tries = ['abc', d.answer, d.answer * 10 + 1,
                       d.answer / 10 - 1]
            .concat((d.mistakes || []).map((m) => m[0]));
        for (const t of tries) {
            field.value = String(t);
            field.dispatchEvent(new Event('input', {bubbles: true}));
            check(ex);
        }
    }
    if (typeset) mj.typesetPromise = typeset;
    read(document.body);
    // the code a learner reads or types: cell sources, starter code and
    // inline code, not printed outputs
    const code = Array.from(document.querySelectorAll(
        '.cell_input pre, .ti-exercise pre, .ti-exercise textarea, '
        + 'code')).map((c) => c.textContent || c.value);
    return {texts, code, counts};
}"""


def english_on(page) -> tuple[dict[str, str], dict]:
    """({word: the text it was read in} of the English words ``page``
    shows once used, the counts of what was used)."""
    seen = page.evaluate(USE_AND_READ_JS, [SKIP, list(READER_ATTRIBUTES)])
    names = set()
    for block in seen["code"]:
        names |= identifiers(block)
    found = {}
    for text in seen["texts"]:
        for word in english_words(text, names) + raw_tex(text):
            found.setdefault(word, " ".join(text.split())[:160])
    return found, seen["counts"]


@pytest.mark.parametrize("rel", ZH_PAGES)
def test_a_chinese_page_shows_no_english_words(used_page, rel):
    found, counts = english_on(used_page(rel))
    if "book/ch" in rel:
        # the walk reached the exercises (a stale selector would pass)
        assert counts["checks"] > 0 and counts["details"] > 0, counts
    assert found == {}, f"English on {rel} ({counts}):\n" + "\n".join(
        f"{word}: {text}" for word, text in found.items())
