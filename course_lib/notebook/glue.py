"""Numbers in the prose that come from the computation (glue).

A chapter's Markdown must not quote a number by hand: the number drifts
when the code changes. Instead a code cell records the value,

    glue("gap_4_heads", mean_1 - mean_4, ".3f")

and the sentence marks where it goes:

    four heads lower the loss by <!--glue:gap_4_heads-->0.067<!--/glue-->

The HTML comments are invisible in Jupyter, Colab and the HTML book, so
every reader sees the plain number. ``scripts/run_notebooks.py`` writes the
glued text between the two markers each time it executes a notebook
(:func:`fill_glue`), and ``tests/test_prose_numbers.py`` fails when the
text between the markers differs from the value its notebook's outputs
record, which nbval in turn checks against a fresh run.

:func:`glue` emits the output format of myst-nb's ``glue(name, value,
display=False)``, so the record is hidden in every front end, and myst-nb
is not needed to run a chapter (it is not installed in Colab).
"""
from __future__ import annotations

import re
from typing import Any

from IPython.display import display

__all__ = ["GLUE_MIME", "GLUE_PREFIX", "MARKER", "fill_glue", "glue",
           "glued_values"]

#: myst-nb's prefix for a glued value that is recorded but not shown.
GLUE_PREFIX = "application/papermill.record/"
GLUE_MIME = GLUE_PREFIX + "text/plain"

_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
#: ``<!--glue:name-->text<!--/glue-->`` in a Markdown cell.
MARKER = re.compile(rf"<!--glue:({_NAME})-->(.*?)<!--/glue-->", re.S)


def glue(name: str, value: Any, fmt: str = "") -> None:
    """Record ``format(value, fmt)`` under ``name`` for the prose.

    Nothing is shown, and nothing is returned, so a ``glue`` call that
    ends a cell adds no output line. The output holds the text under
    myst-nb's hidden mimetype, with ``{"scrapbook": {"name": name, ...}}``
    metadata.
    """
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, got {type(name).__name__}")
    if not re.fullmatch(_NAME, name):
        raise ValueError(f"name must be a Python identifier, got {name!r}")
    if not isinstance(fmt, str):
        raise TypeError(f"fmt must be a format spec string, got "
                        f"{type(fmt).__name__}")
    text = format(value, fmt)
    display({GLUE_MIME: text}, raw=True,
            metadata={"scrapbook": {"name": name,
                                    "mime_prefix": GLUE_PREFIX}})


def _joined(text: str | list[str]) -> str:
    """A notebook's text field: one string, or the list of lines stored
    on disk."""
    return text if isinstance(text, str) else "".join(text)


def glued_values(nb: dict) -> dict[str, str]:
    """Every glued ``name -> text`` in a notebook's stored outputs.

    A name glued twice keeps its last value, as in myst-nb.
    """
    values: dict[str, str] = {}
    for cell in nb["cells"]:
        for out in cell.get("outputs", ()):
            record = out.get("metadata", {}).get("scrapbook")
            data = out.get("data", {})
            if record and GLUE_MIME in data:
                values[record["name"]] = _joined(data[GLUE_MIME])
    return values


def fill_glue(nb: dict) -> list[str]:
    """Write each glued value between its markers in the Markdown cells.

    Returns the names that a marker uses but no output records (the
    marker's text is left as it is).
    """
    values = glued_values(nb)
    missing: list[str] = []

    def fill(m: re.Match) -> str:
        name = m.group(1)
        if name not in values:
            missing.append(name)
            return m.group(0)
        return f"<!--glue:{name}-->{values[name]}<!--/glue-->"

    for cell in nb["cells"]:
        if cell["cell_type"] != "markdown":
            continue
        text = _joined(cell["source"])
        new = MARKER.sub(fill, text)
        if new != text:
            cell["source"] = new
    return missing
