"""Checks that a chapter's prose quotes only numbers its evidence shows.

Two rules, both about one notebook at a time (its Markdown cells against
its own stored outputs, which nbval checks against a fresh run):

1. **Glued numbers.** The text between ``<!--glue:name-->`` and
   ``<!--/glue-->`` must be exactly the text the notebook glued under
   ``name`` (``course_lib.notebook.glue``), and the name must be glued.
2. **Quoted numbers.** Every other decimal in the prose that carries
   information (two or more decimal places, or three or more significant
   digits: ``0.057``, ``2.34``, ``12.5``, not ``0.5`` or ``3.4``) must be
   shown by an output of the same notebook, to the precision the prose
   gives (``2.34`` is shown by ``2.3412``, ``63.1`` by ``63,082,368`` read
   as millions), or be listed with its source in ``prose_numbers_sources.toml``
   (a closed form, a paper's figure, another chapter's result). Numbers in
   math, code and sentences with a citation are exempt: their source is
   on the page.
"""
from __future__ import annotations

import math
import re
import tomllib
from pathlib import Path

from course_lib.notebook.glue import MARKER, glued_values

SOURCES = Path(__file__).with_name("prose_numbers_sources.toml")

#: A decimal number as prose writes it (thousands commas allowed).
DECIMAL = re.compile(r"(?<![\w.\\/-])\d{1,3}(?:,\d{3})*\.\d+(?![\w.]*\d)"
                     r"|(?<![\w.,\\/-])\d+\.\d+(?![\w.]*\d)")
#: Any number in an output (integers too: ``63,082,368`` shows ``63.1``M).
OUTPUT_NUMBER = re.compile(r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?"
                           r"(?:[eE][-+]?\d+)?")

_STRIP = [
    re.compile(r"\$\$.*?\$\$", re.S),                 # display math
    re.compile(r"\\begin\{.*?\\end\{[^}]*\}", re.S),  # LaTeX environments
    re.compile(r"(?<!\\)\$[^$]*?(?<!\\)\$", re.S),    # inline math
    re.compile(r"```(?!\{)[^\n]*\n.*?```", re.S),     # code blocks
    re.compile(r"`[^`\n]*`"),                         # code spans, roles
    re.compile(r"\]\([^)]*\)"),                       # link targets
    re.compile(r"https?://\S+"),
]
_SENTENCE = re.compile(r"(?<=[.;:!?])\s+(?=[A-Z(*\-])|\n\s*\n|\n\s*[-*] ")


def _text(cell: dict) -> str:
    source = cell["source"]
    return source if isinstance(source, str) else "".join(source)


def output_text(nb: dict) -> str:
    """All text the notebook's outputs show (streams and text/plain)."""
    parts = []
    for cell in nb["cells"]:
        for out in cell.get("outputs", ()):
            if "text" in out:
                parts.append(_text({"source": out["text"]}))
            plain = out.get("data", {}).get("text/plain")
            if plain is not None:
                parts.append(_text({"source": plain}))
    return "\n".join(parts)


def glue_problems(nb: dict) -> list[str]:
    """Rule 1: each marker's text against the notebook's glued value, and
    no marker at the start of a line."""
    values = glued_values(nb)
    problems = []
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] != "markdown":
            continue
        for line in _text(cell).splitlines():
            if line.lstrip().startswith("<!--glue:"):
                # Markdown reads a line that starts with "<!--" as an HTML
                # block: it would end the paragraph (or list item) there
                problems.append(f"cell {i}: a line starts with a glue "
                                f"marker, which splits the paragraph: "
                                f"{line.strip()[:40]!r}")
        for m in MARKER.finditer(_text(cell)):
            name, shown = m.groups()
            if name not in values:
                problems.append(f"cell {i}: glue name {name!r} is not "
                                f"recorded by any cell")
            elif shown != values[name]:
                problems.append(f"cell {i}: the prose says {shown!r} where "
                                f"the output of {name!r} is "
                                f"{values[name]!r}")
    return problems


def informative(number: str) -> bool:
    """Two or more decimal places, or three or more significant digits."""
    digits = number.replace(",", "")
    places = len(digits.split(".")[1])
    significant = len(digits.replace(".", "").lstrip("0"))
    return places >= 2 or significant >= 3


def prose_numbers(text: str) -> list[str]:
    """The informative decimals of a Markdown cell outside math, code,
    glue markers and sentences that cite their source."""
    text = MARKER.sub(" ", text)
    for pattern in _STRIP:
        text = pattern.sub(" ", text)
    found = []
    for sentence in _SENTENCE.split(text):
        if "{cite" in sentence:
            continue
        found += [m.group() for m in DECIMAL.finditer(sentence)
                  if informative(m.group())]
    return found


def shown_by(number: str, values: list[float]) -> bool:
    """True if some output value, possibly read in thousands, millions,
    billions or trillions, KiB, MiB or GiB, 万 or 亿 (or a fraction read
    in percent), rounds to ``number`` at the precision it is written
    with."""
    x = float(number.replace(",", ""))
    half_ulp = 0.5 * 10.0 ** -len(number.split(".")[1])
    for y in values:
        for scale in (1.0, 1e3, 1e6, 1e9, 1e12, 2.0 ** 10, 2.0 ** 20, 2.0 ** 30,
                      1e4, 1e8, 0.01):        # 1e4, 1e8: Chinese 万, 亿
            if abs(y / scale - x) <= half_ulp * (1 + 1e-9):
                return True
    return False


def output_values(nb: dict) -> list[float]:
    values = []
    for m in OUTPUT_NUMBER.finditer(output_text(nb)):
        try:
            values.append(float(m.group().replace(",", "")))
        except ValueError:
            continue
    return [v for v in values if math.isfinite(v)]


def listed_sources(stem: str) -> dict[str, str]:
    """``number -> source`` listed for notebook ``stem``."""
    table = tomllib.loads(SOURCES.read_text(encoding="utf-8"))
    return table.get(stem, {})


def unsourced_numbers(nb: dict, sources: dict[str, str]
                      ) -> list[tuple[int, str]]:
    """Rule 2: ``(cell, number)`` for each informative decimal in the
    prose that no output shows and ``sources`` does not list."""
    values = output_values(nb)
    missing = []
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] != "markdown":
            continue
        for number in prose_numbers(_text(cell)):
            if number in sources or number.replace(",", "") in sources:
                continue
            if not shown_by(number, values):
                missing.append((i, number))
    return missing
