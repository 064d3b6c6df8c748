"""The comments of a piece of code, and the code with them translated.

A function exercise gives the learner starter code whose comments are the
instructions:

    def alibi_bias(n_heads, length):
        # 1) the slopes, one per head, shape (H,)
        # 2) the distance i - j of every query i to every key j,
        #    shape (L, L)
        ...

The code is the same in every language; the comments are prose, and a
Chinese learner should read them in Chinese. This module cuts code into
its comments with Python's own tokenizer (so a ``#`` inside a string is
not a comment) and puts translated comments back without touching a
character of the code.

The unit of translation is one *comment*: consecutive lines that hold
nothing but a comment, at the same indentation, are one comment (one
sentence often runs over two lines), except that a line starting with
a step number or a bullet (``1)``, ``-``) starts a new one, so that each
step of a numbered list is translated by itself; a comment after code
on its line stands alone. A comment's text is its lines without the
``#`` and the one space after it, joined by newlines (a continuation
line keeps its extra indentation: ``"2) the distance ...,\\n   shape
(L, L)"``). A comment with no word of three letters or more, such as
a shape ``# (B, T, d_h)``, is notation rather than prose and is left
out.

A translated comment may have more or fewer lines than the English one
(a newline in the translation starts a new comment line at the same
indentation); a translated comment after code stays on its line.
"""
from __future__ import annotations

import io
import re
import tokenize
from dataclasses import dataclass
from typing import Callable

from .._util.validation import check_callable, check_type

__all__ = ["comment_texts", "translate_comments"]

# a word of three or more letters (not part of a name such as d_model or
# int64): prose, not a shape
_PROSE = re.compile(r"\b[A-Za-z]{3,}\b")
# the start of a step of a list: "1) ...", "- ...", "* ..."
_ITEM = re.compile(r"(\d+\)|[-*])\s")


@dataclass
class _Comment:
    """One comment (see the module docstring): ``rows`` (0-based line
    numbers), the column of its ``#``, whether it follows code on its
    line, and its text."""
    rows: list[int]
    col: int
    trailing: bool
    text: str


def _uncomment(comment: str) -> str:
    """``# text`` -> ``text`` (``#`` and one space dropped)."""
    body = comment[1:]
    return body[1:] if body.startswith(" ") else body


def _comments(code: str) -> list[_Comment]:
    """Every prose comment of ``code`` (see the module docstring); none
    if the tokenizer cannot read it."""
    lines = io.StringIO(code).readlines()      # as the tokenizer reads
    found: list[_Comment] = []
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(code).readline))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return []
    for tok in tokens:
        if tok.type != tokenize.COMMENT:
            continue
        row, col = tok.start[0] - 1, tok.start[1]
        trailing = bool(lines[row][:col].strip())
        text = _uncomment(tok.string)
        last = found[-1] if found else None
        if (not trailing and last is not None and not last.trailing
                and last.col == col and last.rows[-1] == row - 1
                and not _ITEM.match(text)):
            last.rows.append(row)
            last.text += "\n" + text
        else:
            found.append(_Comment([row], col, trailing, text))
    return [c for c in found if _PROSE.search(c.text)]


def comment_texts(code: str) -> list[str]:
    """The text of each prose comment of ``code``, in order.

    Args:
        code: Python source (a tokenizer error gives no comments).

    Returns:
        One string per comment, its lines joined by ``"\\n"``.
    """
    check_type("code", code, str, "a str")
    return [c.text for c in _comments(code)]


def translate_comments(code: str, translate: Callable[[str], str]) -> str:
    """``code`` with each prose comment replaced by
    ``translate(its text)``; every character outside those comments
    unchanged (and ``code`` itself where ``translate`` returns the text
    it was given).

    Args:
        code: Python source.
        translate: a comment's English text -> the text to show (for example
            :func:`course_lib.notebook.i18n.tr`).

    Returns:
        The code with its comments in the other language.
    """
    check_type("code", code, str, "a str")
    check_callable("translate", translate)
    lines = io.StringIO(code).readlines()
    replaced: dict[int, list[str]] = {}      # first row -> new lines
    dropped: set[int] = set()
    for comment in _comments(code):
        new = translate(comment.text)
        if new == comment.text:
            continue
        first = comment.rows[0]
        last = lines[comment.rows[-1]]
        end = last[len(last.rstrip("\r\n")):]     # "" on a last line
        if comment.trailing:
            replaced[first] = [lines[first][:comment.col] + "# "
                               + " ".join(new.split("\n")) + end]
        else:
            indent = lines[first][:comment.col]
            replaced[first] = [(indent + "# " + part).rstrip() + "\n"
                               for part in new.split("\n")]
            replaced[first][-1] = replaced[first][-1][:-1] + end
            dropped.update(comment.rows[1:])
    out = []
    for row, line in enumerate(lines):
        if row in replaced:
            out += replaced[row]
        elif row not in dropped:
            out.append(line)
    return "".join(out)
