"""Figures in the reader's language: a CJK font and translated figure text.

The Chinese edition runs the English code cells unchanged, so a figure's
title, axis labels and legend are drawn from English string literals.
Two things turn them into Chinese at draw time, without touching the
code a learner reads:

1. **A font that has the characters.** Colab has no CJK font and
   matplotlib ships none, so the course carries a subset of Noto Sans
   CJK SC (``fonts/CourseCJKSC-Regular.otf``, SIL Open Font License;
   ``scripts/make_cjk_font.py`` makes it). :func:`use_cjk_font` registers
   it and puts it first in ``font.family``, before DejaVu Sans: matplotlib
   falls back along that list glyph by glyph, so hanzi come from the CJK
   font and Greek, arrows and maths symbols from DejaVu. (It must be
   first: mathtext draws the text outside ``$...$`` with the first font
   only.)
2. **The text itself.** :func:`translate_figure` replaces every text of a
   figure that is a key of the translation catalogue
   (:func:`~course_lib.notebook.i18n.catalog`: the chapters' figure
   strings, found in their code by ``scripts/figure_strings.py``). An
   f-string's key is a template, ``"d_k = {d}, std {s:.1f}"``: the drawn
   text is matched against it and the drawn values are carried into the
   translation, ``"d_k = {d}，标准差 {s:.1f}"``. Tick labels that are
   words (categories, fixed labels) are translated through the axis's
   formatter; numbers and text with no entry stay as drawn.

:func:`set_language("zh") <course_lib.notebook.i18n.set_language>` turns
both on (:func:`enable`): the font, and a ``figure.hooks`` entry that
makes every pyplot figure translate itself just before it draws. The
explorers' frames are drawn off pyplot and translate in
:func:`~course_lib.notebook.frames.draw_frame`.
"""
from __future__ import annotations

import functools
import re
import string
from pathlib import Path
from typing import Any

from .._util.validation import check_bool, check_type

__all__ = ["FONT_PATH", "use_cjk_font", "enable", "template_regex",
           "translate_text", "translate_figure", "translate_on_draw"]

#: The bundled CJK font (a subset of Noto Sans CJK SC).
FONT_PATH = (Path(__file__).resolve().parent / "fonts"
             / "CourseCJKSC-Regular.otf")
_HOOK = f"{__name__}:translate_on_draw"
_saved: dict[str, Any] = {}


def use_cjk_font() -> str:
    """Register the bundled CJK font and draw text with it first, DejaVu
    Sans second; returns the font's family name ("Course CJK SC")."""
    import matplotlib as mpl
    from matplotlib import font_manager
    font_manager.fontManager.addfont(str(FONT_PATH))
    family = font_manager.FontProperties(fname=str(FONT_PATH)).get_name()
    mpl.rcParams["font.family"] = [family, "DejaVu Sans"]
    return family


def enable(on: bool) -> None:
    """Draw figures in the reader's language (the font and the hook), or
    restore matplotlib's settings as they were before."""
    import matplotlib as mpl
    check_bool("on", on)
    if on and not _saved:
        _saved.update({k: mpl.rcParams[k]
                       for k in ("font.family", "figure.hooks")})
        use_cjk_font()
        mpl.rcParams["figure.hooks"] = [*mpl.rcParams["figure.hooks"], _HOOK]
    elif not on and _saved:
        mpl.rcParams.update(_saved)
        _saved.clear()


def _fields(template: str) -> tuple[list[str], list[str]]:
    """A template's literal pieces and its fields, as written
    (``{expr:spec}``); len(literals) == len(fields) + 1."""
    literals, fields = [""], []
    for literal, name, spec, conversion in string.Formatter().parse(template):
        literals[-1] += literal
        if name is not None:
            fields.append("{" + name + (f"!{conversion}" if conversion else "")
                          + (f":{spec}" if spec else "") + "}")
            literals.append("")
    return literals, fields


def template_regex(template: str) -> re.Pattern | None:
    """The regex of the texts a template draws: its literal pieces as
    they are, each ``{field}`` any text (a group); None for a plain
    string (no field, or braces that do not pair up)."""
    check_type("template", template, str, "a str")
    try:
        literals, fields = _fields(template)
    except ValueError:
        return None
    if not fields:
        return None
    pattern = "(.+?)".join(re.escape(s) for s in literals)
    return re.compile(rf"\A{pattern}\Z", re.S)


@functools.lru_cache(maxsize=4)
def _compiled(language: str) -> tuple[dict, list]:
    """The catalogue of ``language`` as exact keys and template regexes."""
    from .i18n import catalog
    exact, templates = {}, []
    for english, translated in catalog(language).items():
        regex = template_regex(english)
        if regex is None:
            exact[english] = translated
            continue
        literals, fields = _fields(english)
        if not re.search(r"[A-Za-z]{2}", "".join(literals)):
            continue                 # "{name}" alone would match anything
        templates.append((len("".join(literals)), regex, fields,
                          translated))
    # the most specific template first: "top-{k}, renormalised" before
    # "top-{k}, {how}"
    templates.sort(key=lambda t: -t[0])
    return exact, [t[1:] for t in templates]


def _fill(translated: str, fields: list[str], values: tuple[str, ...],
          language: str) -> str:
    """The translation with each field replaced by the value drawn for the
    English field written the same way, itself translated if it is a
    word with an entry ("scaling {on}" -> "缩放：开")."""
    literals, wanted = _fields(translated)
    pool = list(zip(fields, values))
    out = literals[0]
    for field, literal in zip(wanted, literals[1:]):
        for i, (name, value) in enumerate(pool):
            if name == field:
                out += translate_text(value, language) or value
                del pool[i]
                break
        else:
            out += field
        out += literal
    return out


def translate_text(text: str, language: str) -> str | None:
    """``text`` in ``language``, or None if the catalogue has no entry."""
    exact, templates = _compiled(language)
    if text in exact:
        return exact[text]
    for regex, fields, translated in templates:
        match = regex.match(text)
        if match:
            return _fill(translated, fields, match.groups(), language)
    return None


def translate_figure(fig: Any, language: str | None = None) -> int:
    """Replace each text of ``fig`` (titles, labels, legend entries,
    annotations) by its translation into ``language`` (default: the
    current language); returns how many changed. A text translated
    before is left alone, so a figure may draw many times."""
    from matplotlib.text import Text
    from .i18n import get_language
    if not hasattr(fig, "findobj"):
        raise TypeError(f"fig must be a matplotlib Figure, got "
                        f"{type(fig).__name__}")
    language = get_language() if language is None else language
    if language == "en":
        return 0
    changed = 0
    for ax in getattr(fig, "axes", []):
        for axis in (ax.xaxis, ax.yaxis):
            _translate_ticks(axis.get_major_formatter(), language)
    for t in fig.findobj(Text):
        text = t.get_text()
        if not text or getattr(t, "_ti_shown", None) == text:
            continue
        new = translate_text(text, language)
        if new is not None and new != text:
            t.set_text(new)
            t._ti_shown = new
            changed += 1
    return changed


def _translate_ticks(formatter: Any, language: str) -> None:
    """Tick labels are made while the figure draws, by the axis's
    formatter (category names, ``set_xticks(..., labels=...)``): wrap its
    ``format_ticks`` so that words come out translated (numbers match no
    entry and pass through)."""
    if hasattr(formatter, "_ti_format_ticks"):
        return
    make = formatter._ti_format_ticks = formatter.format_ticks
    formatter.format_ticks = lambda values: [
        (isinstance(label, str) and translate_text(label, language))
        or label for label in make(values)]


def translate_on_draw(fig: Any) -> None:
    """A ``figure.hooks`` entry: ``fig`` translates its text each time
    just before it draws (so text added after ``plt.figure()`` counts)."""
    if not hasattr(fig, "findobj"):
        raise TypeError(f"fig must be a matplotlib Figure, got "
                        f"{type(fig).__name__}")
    draw = fig.draw

    @functools.wraps(draw)
    def draw_translated(renderer):
        translate_figure(fig)
        return draw(renderer)

    fig.draw = draw_translated
