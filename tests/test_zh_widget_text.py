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
show what its static player shows).

Left out, because a learner types or reads them as they are: code
(``<code>``, ``<pre>``), maths (``\\(...\\)``, ``$...$``), message
fields (``{value}``), the English gloss of a term in full-width
parentheses ("输出投影（output projection）", the book's convention at a
term's first use) and a name in Chinese quotation marks (“naive”).
What remains must be Chinese but for:

- code-shaped words: with an underscore or a digit (``d_k``, ``top_p``,
  ``fp16``, ``L1``, ``SmolLM2``), two capitals or more (``MHA``, ``RoPE``,
  ``GiB``), one letter (a variable), an exercise's key (``ch03-scaling``);
- the words of :data:`ALLOWED`: names, units, a few function names and
  the terms the glossary keeps in English (each entry is needed by some
  page);
- in a text that has Chinese in it, an identifier of the chapter's code
  (a name in its code cells or in an exercise's code): "头维度 d_k",
  "底数 base", the identifier beside its Chinese name. A text with no
  Chinese in it (a slider value, a label left untranslated) gets no such
  allowance, so "causal" or "period 5" alone fails.
"""
import html
import io
import json
import re
import tokenize
from html.parser import HTMLParser
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = sorted((ROOT / "zh" / "book").glob("ch*.ipynb"))

# Latin words a Chinese page may show, by kind (case-sensitive).
ALLOWED = {
    # products and tools, people and theorems
    "Python", "Jupyter", "Colab", "Transformer", "Llama", "Mistral",
    "Mixtral", "Falcon", "Lite", "Kimi", "Hugging", "Face", "llama", "cpp",
    "Frobenius", "Eckart", "Young", "Saxena",
    # functions and names as code and maths spell them, outside the
    # chapter's code ("logistic sigmoid", "ceil(1023 / 2)", "词元 id",
    # the shape letter in "(..., Lq, 1)")
    "tanh", "logistic", "ceil", "id", "Lq",
    # maths in starter-code comments, which cannot use $...$ ("-inf",
    # "位置 mod W")
    "inf", "mod",
    # terms the glossary (zh/book/glossary.md) keeps in English
    "logits", "logit", "top-k", "top-p", "min-p", "rank", "all-reduce",
    "all-gather", "reduce-scatter",
    # units
    "byte",
}

# Chinese characters and full-width punctuation ("weight：(R, C)")
_CJK = re.compile("[\u3000-\u303f\u3400-\u4dbf\u4e00-\u9fff\uff00-\uffef]")
_MATH = re.compile(r"\\\(.*?\\\)|\\\[.*?\\\]|\$\$.*?\$\$|\$[^$]*\$", re.S)
_FIELD = re.compile(r"\{\w+(?::[^{}]*)?\}")
_GLOSS = re.compile(r"（[^（）\u3400-\u9fff]*）|“[^“”\u3400-\u9fff]*”")
_WORD = re.compile(r"[A-Za-z0-9_]+(?:-[A-Za-z0-9_]+)*")
_KEY = re.compile(r"ch\d\d-[a-z0-9-]+")
_ATTRS = ("aria-label", "aria-valuetext", "alt", "placeholder", "title")


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
        self.texts += [a[k] for k in _ATTRS if a.get(k)]
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


def comments(source: str) -> list[str]:
    """The comments of Python code, without their ``#``."""
    try:
        return [t.string.lstrip("#").strip() for t in tokenize.generate_tokens(
            io.StringIO(source).readline) if t.type == tokenize.COMMENT]
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return re.findall(r"#(.*)", source)


def identifiers(source: str) -> set[str]:
    """The names (and keywords) of Python code."""
    found = set()
    try:
        for t in tokenize.generate_tokens(io.StringIO(source).readline):
            if t.type == tokenize.NAME:
                found.add(t.string)
    except (tokenize.TokenError, IndentationError, SyntaxError):
        found |= set(re.findall(r"[A-Za-z_]\w*", source))
    return found


def english_words(text: str, names: set[str]) -> list[str]:
    """The words of ``text`` a Chinese page should not show."""
    has_chinese = bool(_CJK.search(text))
    text = _GLOSS.sub(" ", _FIELD.sub(" ", _MATH.sub(" ", html.unescape(
        text))))
    bad = []
    for word in _WORD.findall(text):
        if word in ALLOWED or _KEY.fullmatch(word):
            continue
        if has_chinese and word in names:       # the identifier beside it
            continue
        parts = [p for p in word.split("-") if re.search("[A-Za-z]", p)]
        if all(p in ALLOWED or len(p) == 1 or re.search(r"[_\d]", p)
               or len(re.findall("[A-Z]", p)) >= 2
               or (has_chinese and p in names) for p in parts):
            continue
        bad.append(word)
    return bad


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
