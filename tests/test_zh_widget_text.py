"""What a Chinese reader sees in the widgets of the Chinese notebooks.

For every ``zh/book/ch*.ipynb`` (written and run by ``make zh``) this
collects the visible text of the saved widget outputs: every HTML output
of course_lib's widgets (class ``ti-...``: explorers, exercises, the chat
box's note), that is its text, the labels, option values and read-outs of
the sliders (``data-values``, ``aria-valuetext``), the other attributes a
reader or a screen reader meets (``aria-label``, ``alt``, ``placeholder``,
``title``), and the feedback messages an exercise holds for its Check
button (its ``d = {...}`` data). The notebooks store no widget state
(``run_notebooks.py``); the live widgets take the same translated texts
(``tests/test_explorer_values.py`` checks that an explorer's live sliders
show what its static player shows). Which words fail, and which a
Chinese page may show, is ``zh_scan``'s rule; the built pages as a whole
are walked in a browser by ``tests/browser/test_zh_pages.py``.
"""
import json
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest

from zh_scan import READER_ATTRIBUTES, comments, english_words, identifiers

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = sorted((ROOT / "zh" / "book").glob("ch*.ipynb"))


class _Visible(HTMLParser):
    """Texts of an HTML fragment a reader sees, its code blocks, and
    among them the starter code (not inside a hint or a solution)."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.texts, self.code, self.scripts = [], [], []
        self.starter = []
        self._open = []                   # script/style/pre/code we are in
        self._details = 0                 # inside <details>: hint, solution

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.texts += [a[k] for k in READER_ATTRIBUTES if a.get(k)]
        if a.get("data-values"):                  # an explorer's slider
            self.texts += json.loads(a["data-values"])
        if tag in ("script", "style", "pre", "code"):
            self._open.append([tag, ""])
        self._details += tag == "details"

    def handle_endtag(self, tag):
        self._details -= tag == "details"
        if self._open and self._open[-1][0] == tag:
            kind, text = self._open.pop()
            if kind == "script":
                self.scripts.append(text)
            elif kind in ("pre", "code"):
                self.code.append(text)
                if kind == "pre" and not self._details:
                    self.starter.append(text)

    def handle_data(self, data):
        if self._open:
            for entry in self._open:          # <pre><code>: both hold it
                entry[1] += data
        elif data.strip():
            self.texts.append(data)


def visible(fragment: str) -> tuple[list[str], list[str]]:
    """(texts a reader sees, code shown) of a widget's HTML, with the
    messages of an exercise's ``d = {...}`` data (HTML themselves)."""
    parser = _Visible()
    parser.feed(fragment)
    texts, code = parser.texts, parser.code
    # the starter code's comments are the learner's instructions
    texts = texts + [c for block in parser.starter for c in comments(block)]
    for script in parser.scripts:
        data = re.search(r", d = (\{.*\});\n", script)
        if data:
            for leaf in _leaves(json.loads(data.group(1))):
                more, more_code = visible(leaf)
                texts, code = texts + more, code + more_code
    return texts, code


def _leaves(x):
    if isinstance(x, str):
        yield x
    elif isinstance(x, (dict, list)):
        for v in (x.values() if isinstance(x, dict) else x):
            yield from _leaves(v)




def widget_outputs(nb: dict):
    """(cell id, HTML) of every saved output of a course_lib widget."""
    for cell in nb["cells"]:
        for out in cell.get("outputs", []):
            fragment = "".join(out.get("data", {}).get("text/html", ""))
            if 'class="ti-' in fragment:
                yield cell.get("id"), fragment


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem[:4])
def test_chinese_widgets_show_no_english_words(path):
    nb = json.loads(path.read_text())
    code = "\n".join("".join(c["source"]) for c in nb["cells"]
                     if c["cell_type"] == "code")
    outputs = list(widget_outputs(nb))
    assert outputs, "run `make zh`"
    names = identifiers(code)
    for _, fragment in outputs:
        names |= {n for block in visible(fragment)[1]
                  for n in identifiers(block)}
    found = {}
    for cid, fragment in outputs:
        for text in visible(fragment)[0]:
            for word in english_words(text, names):
                found.setdefault(f"cell {cid}: {word}", text.strip()[:80])
    assert found == {}


def test_the_scan_finds_english_and_spares_what_it_should():
    page = (
        '<div class="ti-explorer"><label class="ti-control">头维度 d_k '
        '<input data-values=\'["开", "causal", "top-p 0.9"]\' '
        'aria-valuetext="开"> <output>开</output></label>'
        '<label class="ti-control">head <input data-values=\'["1"]\'>'
        '</label><p class="ti-note"><em>在 Colab 中打开本章。</em></p>'
        '<p>输出投影（output projection）\\(W^O\\) 与 “naive” 模式，'
        '<code>two words</code>，{value} 与 底数 base，but not this</p>'
        '<script>var root = 1, d = {"t": {"x": "Try the <em>hint</em>."}};\n'
        '</script></div>')
    texts, code = visible(page)
    assert code == ["two words"] * 1
    names = {"d_k", "head", "base"}
    bad = [w for t in texts for w in english_words(t, names)]
    # "causal" is a value with no Chinese; "head" a label left in English;
    # "but not this" sits in Chinese text but is no identifier; the
    # exercise's feedback is read from its data
    assert bad == ["causal", "head", "but", "not", "this", "Try", "the",
                   "hint"]
