"""Reading the book's notebooks from tests: the source of the one cell that
builds an exercise (tests that run a chapter's exercise outside Jupyter)."""
import json
import pathlib

BOOK = pathlib.Path(__file__).resolve().parent.parent / "book"


def exercise_cell(notebook: str, key: str) -> str:
    """Source of the single cell of ``book/notebook`` with ``key="key"``."""
    cells = json.loads((BOOK / notebook).read_text())["cells"]
    found = [c for c in cells if f'key="{key}"' in "".join(c["source"])]
    assert len(found) == 1, f"{notebook}: no single cell with {key!r}"
    return "".join(found[0]["source"])
