"""Reading a learner's numeric answer: one number grammar, shared by the
Python checker (:func:`parse_number`) and the page's JavaScript checker of
:class:`course_lib.exercises.NumericExercise`.

Introduced in chapter 1.
"""
from __future__ import annotations

import math
import numbers
import re
from typing import Any

from .i18n import tr

__all__ = ["parse_number"]

# ----------------------------------------------------------------------------
# Numeric answers
# ----------------------------------------------------------------------------
# One grammar for the Python checker and the page's JavaScript checker
# (NumericExercise._static_body writes the same rules in JS): ASCII digits,
# an optional decimal point and exponent, or a fraction a/b. A comma is a
# thousands separator when it groups digits by three (2,362,368 or
# 1,234.5), and a decimal comma otherwise (0,6652 or 1,5).
_NUM = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
_NUMBER_RE = re.compile(rf"^({_NUM})$", re.ASCII)
_FRACTION_RE = re.compile(rf"^({_NUM})\s*/\s*({_NUM})$", re.ASCII)
_THOUSANDS_RE = re.compile(r"^[-+]?[1-9]\d{0,2}(?:,\d{3})+(?:\.\d*)?$",
                           re.ASCII)
_DECIMAL_COMMA_RE = re.compile(r"^[-+]?\d+,\d+$", re.ASCII)


def _normalise_commas(text: str) -> str:
    if "," not in text:
        return text
    if _THOUSANDS_RE.match(text):
        return text.replace(",", "")         # 2,362,368 -> 2362368
    if _DECIMAL_COMMA_RE.match(text):
        return text.replace(",", ".")        # 0,6652 -> 0.6652
    return text                              # left for the error below


def parse_number(answer: Any) -> float:
    """A finite float from a number, 0-d array/tensor or text like ``2/3``.

    Text follows one grammar, shared with the page's JavaScript checker:
    ``0.25``, ``-2.5e-3``, ``1/4``, thousands separators grouping by three
    (``2,362,368``) and a decimal comma (``0,6652``, ``1,5``).

    Raises ValueError with a learner-readable message otherwise.
    """
    if isinstance(answer, bool):
        raise ValueError(tr("a number is expected, not True/False"))
    if hasattr(answer, "item") and getattr(answer, "ndim", 0) == 0:
        try:
            answer = answer.item()
        except (RuntimeError, ValueError):         # e.g. a meta tensor
            raise ValueError(tr("this tensor holds no value to read")) \
                from None
    if isinstance(answer, numbers.Real):
        try:
            value = float(answer)
        except OverflowError:                      # e.g. 10**400
            raise ValueError(tr("the number is too large to be an "
                                "answer")) from None
    elif isinstance(answer, str):
        text = _normalise_commas(answer.strip())
        if not text:
            raise ValueError(tr("the answer is empty: type a number"))
        whole, frac = _NUMBER_RE.match(text), _FRACTION_RE.match(text)
        try:
            if not (whole or frac):
                raise ValueError
            value = (float(frac.group(1)) / float(frac.group(2)) if frac
                     else float(text))
        except (ValueError, ZeroDivisionError):
            raise ValueError(tr(
                "{answer} is not a number (write e.g. 0.25, 2.5e-3 or 1/4)",
                answer=f"{answer.strip()!r:.40}")) from None
    else:
        raise ValueError(tr("a number is expected, got a {type}",
                            type=type(answer).__name__))
    if not math.isfinite(value):
        raise ValueError(tr("{answer} is not a finite number",
                            answer=f"{str(answer).strip()!r:.40}"))
    return value


def _exact(value: float) -> str:
    """A number as the learner gave it: 2362368, not 2.36237e+06."""
    return str(int(value)) if value.is_integer() and abs(value) < 1e16 \
        else repr(value)
