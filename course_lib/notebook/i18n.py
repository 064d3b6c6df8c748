"""The language of what a reader sees in exercises and explorers.

The course is written in English; its Chinese edition (``zh``) runs the
same notebooks with one extra cell, ``set_language("zh")``. From then on
:func:`tr` returns the Chinese text of every string an exercise or an
explorer shows: the chapter's own prompts, options, hints and solutions
(keyed by their English text, in ``locale/zh/<notebook>.json``, written
with ``scripts/zh_translations.py``) and the library's own messages
(``locale/zh/ui.json``). A string with no translation is shown in
English, so a missing entry degrades the page instead of breaking it
(the tests check that none is missing).

Messages with values in them are templates: ``tr("Correct: {value}.",
value=x)`` looks up the template, then fills it in with
:meth:`str.format`.

The language can also be chosen before Python starts, with the
environment variable ``COURSE_LANGUAGE=zh``.
"""
from __future__ import annotations

import functools
import json
import os
from pathlib import Path

__all__ = ["LANGUAGES", "set_language", "get_language", "catalog", "tr"]

LANGUAGES = ("en", "zh")
LOCALE = Path(__file__).resolve().parent / "locale"


def _checked(language: object) -> str:
    if language not in LANGUAGES:
        raise ValueError(f"language must be one of {LANGUAGES}, got "
                         f"{language!r}")
    return language


_state = {"language": _checked(os.environ.get("COURSE_LANGUAGE", "en")
                               or "en")}
if _state["language"] != "en":            # COURSE_LANGUAGE=zh: figures too
    from .figure_text import enable as _enable_figures
    _enable_figures(True)


def set_language(language: str) -> None:
    """Show exercises, explorers and figures in ``language`` ("en" or
    "zh"): in Chinese, figures are drawn with a bundled CJK font and their
    text translated (:mod:`~course_lib.notebook.figure_text`)."""
    _state["language"] = _checked(language)
    from .figure_text import enable
    enable(language != "en")


def get_language() -> str:
    """The current language, "en" or "zh"."""
    return _state["language"]


@functools.lru_cache(maxsize=None)
def catalog(language: str) -> dict[str, str]:
    """English text -> its translation, for every string of ``language``:
    the library's messages (``ui.json``) and every chapter's strings."""
    found: dict[str, str] = {}
    folder = LOCALE / _checked(language)
    for path in sorted(folder.glob("*.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        strings = data if path.name == "ui.json" else data.get("strings", {})
        found.update({en: t for en, t in strings.items() if t})
    return found


def tr(text: str, /, **fields: object) -> str:
    """``text`` in the current language, its ``{fields}`` filled in.

    In English (or with no translation) this is ``text.format(**fields)``
    (just ``text`` when no fields are given, so literal braces in a plain
    string are safe).
    """
    language = get_language()
    if language != "en":
        text = catalog(language).get(text, text)
    return text.format(**fields) if fields else text
