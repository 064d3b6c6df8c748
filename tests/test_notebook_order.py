"""scripts/notebook_order.py: the order nbval hands out the chapters in,
and the chapters ``make test`` runs beside the unit tests (``--fill``),
both from the run times stored in the notebooks."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import notebook_order  # noqa: E402


def fake_notebook(folder: Path, name: str, cell_seconds: list[float]) -> str:
    """A notebook whose code cells record the given run times."""
    cells = [{"cell_type": "code", "metadata": {"execution": {
        "iopub.execute_input": "2026-12-02T10:00:00.000000Z",
        "shell.execute_reply":
            f"2026-12-02T10:{int(s) // 60:02d}:{s % 60:09.6f}Z"}},
        "source": "", "outputs": [], "execution_count": 1}
        for s in cell_seconds]
    cells.append({"cell_type": "markdown", "metadata": {}, "source": "x"})
    path = folder / name
    path.write_text(json.dumps({"cells": cells}))
    return str(path)


@pytest.fixture()
def book(tmp_path):
    return {name: fake_notebook(tmp_path, name, times) for name, times in {
        "a.ipynb": [30.0, 14.5],          # 44.5 s
        "b.ipynb": [39.0],
        "c.ipynb": [10.0, 0.75],          # 10.75 s
        "d.ipynb": [8.25],
        "e.ipynb": [],                    # never executed: 0 s
    }.items()}


def test_recorded_seconds_sums_the_code_cells(book):
    assert notebook_order.recorded_seconds(book["a.ipynb"]) == 44.5
    assert notebook_order.recorded_seconds(book["c.ipynb"]) == 10.75
    assert notebook_order.recorded_seconds(book["e.ipynb"]) == 0.0


def test_longest_first_and_ties_by_name(book):
    names = [Path(p).name for p in notebook_order.longest_first(
        list(book.values())[::-1])]
    assert names == ["a.ipynb", "b.ipynb", "c.ipynb", "d.ipynb", "e.ipynb"]


@pytest.mark.parametrize("seconds, expected", [
    (95, ["a.ipynb", "b.ipynb", "c.ipynb", "e.ipynb"]),   # then d not
    (92, ["a.ipynb", "b.ipynb", "d.ipynb", "e.ipynb"]),   # c not, d does
    (40, ["b.ipynb", "e.ipynb"]),                         # a is too long
    (0, ["e.ipynb"]),
])
def test_fill_takes_each_notebook_that_still_fits(book, seconds, expected):
    chosen = notebook_order.fill(list(book.values()), seconds)
    assert [Path(p).name for p in chosen] == expected
    assert sum(map(notebook_order.recorded_seconds, chosen)) <= seconds


def test_command_line(book):
    run = lambda *a: subprocess.run(  # noqa: E731
        [sys.executable, str(ROOT / "scripts" / "notebook_order.py"), *a],
        capture_output=True, text=True, check=True).stdout.split()
    paths = sorted(book.values())
    assert run(*paths) == notebook_order.longest_first(paths)
    assert run("--fill", "40", *paths) == [book["b.ipynb"], book["e.ipynb"]]
