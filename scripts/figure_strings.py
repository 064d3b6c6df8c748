"""The text a chapter's code draws into its figures, for translation.

A figure's title, axis labels, legend entries and annotations are string
literals in the chapter's code cells: the arguments of ``set_title``,
``set_xlabel``, ``set_ylabel``, ``suptitle``, ``text``, ``annotate``,
``legend``, ... and the keywords ``title``, ``xlabel``, ``ylabel`` and
``label`` of any call. :func:`figure_strings` finds them with the parser.
An f-string becomes a template: each replacement field is kept as
``{expression}`` (its format spec too), and at draw time
:func:`course_lib.notebook.figure_text.translate_figure` matches the drawn
text against the template and carries the drawn values over into the
translation. Strings with no letters outside ``$...$`` (numbers, pure
maths) need no translation and are skipped.

    python scripts/figure_strings.py ch03      # list a chapter's strings
"""
from __future__ import annotations

import ast
import functools
import json
import re
import sys
from pathlib import Path

from course_lib.notebook.figure_text import template_regex

ROOT = Path(__file__).resolve().parents[1]

#: method -> index of the positional argument that holds the text
TEXT_ARG = {"set_title": 0, "set_xlabel": 0, "set_ylabel": 0,
            "suptitle": 0, "supxlabel": 0, "supylabel": 0,
            "title": 0, "xlabel": 0, "ylabel": 0, "set_label": 0,
            "annotate": 0, "text": 2, "figtext": 2}
#: keywords whose string a figure shows, in any call
TEXT_KEYWORDS = {"title", "xlabel", "ylabel", "label"}
_MATH = re.compile(r"\$[^$]*\$")


def template(node: ast.AST, source: str) -> str | None:
    """The text of a string literal, or an f-string as a template with
    ``{expression[:spec]}`` fields; None for anything else."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if not isinstance(node, ast.JoinedStr):
        return None
    parts = []
    for v in node.values:
        if isinstance(v, ast.Constant):
            parts.append(v.value.replace("{", "{{").replace("}", "}}"))
        elif isinstance(v, ast.FormattedValue):
            expr = ast.get_source_segment(source, v.value) or "value"
            spec = ""
            if v.format_spec is not None:
                spec = ":" + "".join(
                    s.value for s in v.format_spec.values
                    if isinstance(s, ast.Constant))
            parts.append("{" + expr + spec + "}")
    return "".join(parts)


def needs_translation(text: str) -> bool:
    """True if the text has letters outside its maths and fields."""
    bare = _MATH.sub("", re.sub(r"\{[^{}]*\}", "", text))
    return bool(re.search(r"[A-Za-z]{2,}", bare))


def strings_in_code(source: str) -> list[str]:
    """The figure texts of one code cell's source, in order."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    found: dict[str, None] = {}

    def add(node):
        if isinstance(node, (ast.List, ast.Tuple)):
            for elt in node.elts:
                add(elt)
            return
        text = template(node, source)
        if text is not None and needs_translation(text):
            found.setdefault(text)

    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = (node.func.attr if isinstance(node.func, ast.Attribute)
                else getattr(node.func, "id", None))
        if name in TEXT_ARG and len(node.args) > TEXT_ARG[name]:
            add(node.args[TEXT_ARG[name]])
        if name == "legend":
            for arg in node.args:
                add(arg)
        for kw in node.keywords:
            if kw.arg in TEXT_KEYWORDS:
                add(kw.value)
    return list(found)


def all_strings_in_code(source: str) -> set[str]:
    """Every string literal and f-string template of a source text: the
    texts a figure may show through a variable (``label=name``)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return set()
    found = set()
    for node in ast.walk(tree):
        text = template(node, source)
        # any literal text but a bare field: "{label} (I = {I:.0f})" too
        if text is not None and re.sub(r"\{[^{}]*\}", "", text).strip():
            found.add(text)
    return found


@functools.lru_cache(maxsize=1)
def _library_strings() -> frozenset[str]:
    found = set()
    for path in (ROOT / "course_lib").rglob("*.py"):
        found |= all_strings_in_code(path.read_text(encoding="utf-8"))
    return frozenset(found)


@functools.lru_cache(maxsize=32)
def code_strings(notebook: Path) -> frozenset[str]:
    """The texts a translation of a figure may be keyed by: every string
    of the notebook's code cells and of course_lib (a figure text built
    from a variable is one of them)."""
    nb = json.loads(Path(notebook).read_text())
    found = set(_library_strings())
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            found |= all_strings_in_code("".join(cell["source"]))
    return frozenset(found)


@functools.lru_cache(maxsize=32)
def _code_templates(notebook: Path) -> list[re.Pattern]:
    """The regexes of the templates among :func:`code_strings`."""
    return [r for r in map(template_regex, code_strings(notebook))
            if r is not None]


def in_code(text: str, notebook: Path) -> bool:
    """True if a figure may show ``text``: it is a string of the code
    (:func:`code_strings`), or one drawn from a code template with its
    fields filled (``"before balancing"`` from ``f"{phase} balancing"``,
    a template from a template: its own fields filled in first)."""
    if text in code_strings(notebook):
        return True
    filled = re.sub(r"\{[^{}]*\}", "x", text)
    return any(r.match(text) or r.match(filled)
               for r in _code_templates(notebook))


def figure_strings(notebook: Path) -> list[str]:
    """Every figure text of a notebook's code cells, in order, once."""
    nb = json.loads(Path(notebook).read_text())
    found: dict[str, None] = {}
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            for text in strings_in_code("".join(cell["source"])):
                found.setdefault(text)
    return list(found)


if __name__ == "__main__":
    chosen = sys.argv[1:] or ["ch"]
    for path in sorted((ROOT / "book").glob("ch*.ipynb")):
        if any(path.name.startswith(c) for c in chosen):
            texts = figure_strings(path)
            print(f"# {path.stem}: {len(texts)}")
            for t in texts:
                print("  ", repr(t))
