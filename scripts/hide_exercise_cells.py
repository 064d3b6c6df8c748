"""Collapse the code of every exercise cell in Jupyter, Colab and the book.

An exercise cell builds its checker, so its code holds the answer (the
``answer=`` value, the reference, the worked solution). A reader sees the
exercise widget it displays, never that code, unless they choose to open
it:

- the book: the ``hide-input`` tag (a "Click to show" toggle);
- Jupyter: ``metadata.jupyter.source_hidden`` (the cell's input is
  collapsed to a bar);
- Colab: ``metadata.cellView = "form"`` and a first line ``# @title ...``
  (Colab shows the title and a "Show code" link instead of the code).

``tests/test_answers_out_of_sight.py`` fails on an exercise cell without
all three. Usage: ``python scripts/hide_exercise_cells.py [NOTEBOOK ...]``
(every notebook of ``book/`` when none is named).
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
TITLE = "# @title Exercise (the code holds the answer: run it, don't read it)"
BUILDS_EXERCISE = re.compile(r"^\s*(?:\w+\s*=\s*)?\w*Exercise\(", re.M)


def is_exercise_cell(cell: dict) -> bool:
    """A code cell that builds an exercise."""
    return (cell.get("cell_type") == "code"
            and bool(BUILDS_EXERCISE.search(cell.get("source", ""))))


def hide(cell: dict) -> bool:
    """Collapse one exercise cell; True if anything changed."""
    before = nbformat.writes(nbformat.from_dict(
        {"cells": [cell], "metadata": {}, "nbformat": 4,
         "nbformat_minor": 5}))
    meta = cell.setdefault("metadata", {})
    tags = meta.setdefault("tags", [])
    if "hide-input" not in tags:
        tags.append("hide-input")
    meta.setdefault("jupyter", {})["source_hidden"] = True
    meta["cellView"] = "form"
    source = cell["source"]
    if not source.startswith("# @title"):
        cell["source"] = TITLE + "\n" + source
    after = nbformat.writes(nbformat.from_dict(
        {"cells": [cell], "metadata": {}, "nbformat": 4,
         "nbformat_minor": 5}))
    return before != after


def main(paths: list[str]) -> int:
    notebooks = [Path(p) for p in paths] or sorted(
        (ROOT / "book").glob("ch*.ipynb"))
    for path in notebooks:
        nb = nbformat.read(path, as_version=4)
        changed = [i for i, c in enumerate(nb.cells)
                   if is_exercise_cell(c) and hide(c)]
        if changed:
            nbformat.write(nb, path)
            print(f"{path.name}: collapsed cells {changed}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
