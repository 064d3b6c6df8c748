"""No numeric exercise asks for a number the page has already shown.

An exercise whose answer is printed a few cells above it tests copying,
not understanding (the blind reviews of 2026-12-05 found five). For every
``NumericExercise`` of a chapter, its answer is read from the exercise's
stored output (the page's checker carries it), and every markdown cell and
every text output above it is searched for a number that states the
answer: written with at least three significant digits and equal to the
answer rounded to them (``1.250`` states 1.25, ``70,272`` states 70272,
``120.9`` states 120.888...). A bare integer below 1000 (``128``) is too
common to count, and answers that are small whole numbers (counts) are
skipped.

The code of an exercise cell holds its answer, so that code is collapsed
in all three places a learner meets it (``scripts/hide_exercise_cells.py``),
and every chapter has at least one prediction and one transfer exercise
(their ``purpose``, which each exercise's page HTML carries).

``KNOWN`` lists the exercises that still fail this, to be replaced by
exercises on values the chapter never printed. The list can
only shrink: an entry that no longer fails must be removed.
"""
import json
import math
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "book").glob("ch*.ipynb"))

KNOWN: set[str] = set()

NUMBER = re.compile(r"(?<![\w.])(\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+\.\d+|\d+)"
                    r"(?:[eE]([-+]?\d+))?(?!\w)")
EXERCISE_DATA = re.compile(r", d = (\{.*?\});\n")


def _text(value) -> str:
    return "".join(value) if isinstance(value, list) else (value or "")


def _visible_text(output: dict) -> str:
    """What an output shows a reader (an exercise's own HTML excluded:
    its script carries the answer but does not display it)."""
    if output["output_type"] == "stream":
        return _text(output.get("text"))
    data = output.get("data", {})
    html = _text(data.get("text/html"))
    if "ti-exercise" in html:
        return ""
    return _text(data.get("text/plain")) + " " + re.sub(r"<[^>]+>", " ",
                                                        html)


def _significant_digits(token: str) -> int:
    return len(token.replace(",", "").replace(".", "").lstrip("0"))


def _states(token: str, exponent: str | None, answer: float) -> bool:
    """Whether the number written as ``token`` states ``answer``."""
    digits = _significant_digits(token)
    plain = token.replace(",", "")
    if digits < 3 or ("." not in plain and "," not in token
                      and exponent is None and int(plain) < 1000):
        return False
    try:
        value = float(plain) * (10.0 ** int(exponent) if exponent else 1.0)
    except OverflowError:
        return False
    if answer == 0 or not math.isfinite(value):
        return False
    places = digits - 1 - math.floor(math.log10(abs(answer)))
    return abs(value - round(answer, places)) <= 1e-9 * max(1.0, abs(value))


def numeric_exercises_and_leaks(path: Path) -> dict[str, list[str]]:
    """Each numeric exercise's key -> where its answer shows above it."""
    found: dict[str, list[str]] = {}
    seen: list[tuple[int, str]] = []
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    for index, cell in enumerate(cells):
        for output in cell.get("outputs", []):
            html = _text(output.get("data", {}).get("text/html"))
            match = EXERCISE_DATA.search(html)
            if not match or '"answer"' not in match.group(1):
                continue
            data = json.loads(match.group(1).replace("<\\/", "</"))
            answer = data["answer"]
            if not isinstance(answer, (int, float)) or isinstance(
                    answer, bool):
                continue                  # a choice: its answer is an index
            key = re.search(r'id="ti-ex-([^"]+)"', html).group(1)
            leaks = []
            if not (float(answer).is_integer() and abs(answer) < 100):
                for where, text in seen:
                    for m in NUMBER.finditer(text):
                        if _states(m.group(1), m.group(2), float(answer)):
                            leaks.append(f"cell {where}: ...{text[max(0, m.start() - 40):m.end() + 10]!r}")
            found[key] = leaks
        if cell["cell_type"] == "markdown":
            seen.append((index, _text(cell["source"])))
        for output in cell.get("outputs", []):
            seen.append((index, _visible_text(output)))
    return found


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem[:4])
def test_no_numeric_answer_is_printed_above_its_exercise(path):
    found = numeric_exercises_and_leaks(path)
    leaking = {key for key, leaks in found.items() if leaks}
    new = {key: found[key][:3] for key in leaking - KNOWN}
    assert not new, f"answers shown above their exercise: {new}"
    fixed = {key for key in KNOWN if key in found and key not in leaking}
    assert not fixed, f"no longer shown above: remove from KNOWN: {fixed}"


def test_the_scan_finds_every_known_leak_and_the_exercises():
    everything = {}
    for path in NOTEBOOKS:
        everything.update(numeric_exercises_and_leaks(path))
    assert len(everything) >= 15                  # the scan finds them
    assert KNOWN <= set(everything)               # no stale key


# Chapters still without a prediction or a transfer exercise: can only
# shrink.
MISSING_PURPOSE: set[tuple[str, str]] = set()

PURPOSE = re.compile(r'<div class="ti-exercise[^"]*" id="ti-ex-([^"]+)" '
                     r'data-purpose="([a-z]+)"')
BUILDS_EXERCISE = re.compile(r"^\s*(?:\w+\s*=\s*)?\w*Exercise\(", re.M)


def purposes(path: Path) -> dict[str, str]:
    """Each exercise's key -> its purpose, read from the stored outputs."""
    found = {}
    for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
        for output in cell.get("outputs", []):
            html = _text(output.get("data", {}).get("text/html"))
            found.update(PURPOSE.findall(html))
    return found


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem[:4])
def test_every_chapter_asks_for_a_prediction_and_a_transfer(path):
    have = set(purposes(path).values())
    missing = {(path.stem[:4], p) for p in ("prediction", "transfer")
               if p not in have}
    assert not missing - MISSING_PURPOSE, f"no exercise of: {missing}"
    fixed = {m for m in MISSING_PURPOSE if m[0] == path.stem[:4]} - missing
    assert not fixed, f"now present: remove from MISSING_PURPOSE: {fixed}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem[:4])
def test_exercise_code_is_collapsed_in_the_book_jupyter_and_colab(path):
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    built = [i for i, c in enumerate(cells) if c["cell_type"] == "code"
             and BUILDS_EXERCISE.search(_text(c["source"]))]
    assert built
    for i in built:
        meta = cells[i]["metadata"]
        assert "hide-input" in meta.get("tags", []), (i, "book")
        assert meta.get("jupyter", {}).get("source_hidden") is True, (
            i, "Jupyter")
        assert meta.get("cellView") == "form", (i, "Colab")
        assert _text(cells[i]["source"]).startswith("# @title "), (
            i, "Colab's form title")
    shown = sum(len(purposes(path)) for _ in [0])
    assert shown >= len(built)          # every cell shows its exercise


@pytest.mark.parametrize("token, answer, states", [
    ("1.250", 1.25, True), ("70,272", 70272, True), ("120.9", 120.8889, True),
    ("121", 120.8889, False),          # a bare integer below 1000
    ("0.18", 0.17647, False),          # two significant digits: too loose
    ("0.176", 0.17647, True), ("0.177", 0.17647, False),
    ("3,152,384", 3152384, True), ("3,152,385", 3152384, False)])
def test_what_counts_as_stating_the_answer(token, answer, states):
    assert _states(token, None, answer) is states
