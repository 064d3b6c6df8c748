"""A tiny Markdown-to-HTML converter for exercise prompts, hints,
solutions and feedback, and for explorer titles: paragraphs, code,
``**bold**``, ``*emphasis*`` and ``$math$`` kept for MathJax.
"""
from __future__ import annotations

import html
import re

from .._util.validation import check_bool

__all__ = ["markdown_to_html"]

_FENCE_RE = re.compile(r"```[a-zA-Z0-9_-]*\n(.*?)```", re.S)
_CODE_RE = re.compile(r"`([^`]+)`")
_BOLD_RE = re.compile(r"\*\*([^*]+)\*\*")
# *emphasis*: a single asterisk that opens before a non-space and closes
# after one, not inside a Latin word or number (so 2*3*4 stays as typed);
# Chinese has no spaces between words, so 但*不*除 is emphasis.
_EM_RE = re.compile(r"(?<![A-Za-z0-9_*])\*(?=[^\s*])([^*\n]+?)(?<=[^\s*])\*"
                    r"(?![A-Za-z0-9_*])")
_DISPLAY_MATH_RE = re.compile(r"\$\$(.+?)\$\$", re.S)
_INLINE_MATH_RE = re.compile(r"(?<![\\$])\$([^$\n]+?)\$")


def markdown_to_html(text: str, *, tex_delimiters: bool = False,
                     inline: bool = False) -> str:
    """Convert the small Markdown subset used in exercises to HTML.

    Supported: paragraphs (blank-line separated), fenced code blocks,
    inline ``code``, ``**bold**``, ``*emphasis*`` and ``$...$``/``$$...$$``
    math, which is kept for MathJax (with ``tex_delimiters`` rewritten to
    ``\\(...\\)`` and ``\\[...\\]``, the delimiters the book's MathJax
    processes in outputs). Everything else is escaped, so learner-visible
    text cannot inject HTML. ``inline`` converts one line of text without
    wrapping it in ``<p>`` (for option labels and feedback messages).
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    check_bool("tex_delimiters", tex_delimiters)
    check_bool("inline", inline)
    if inline:
        return _inline(" ".join(text.split()), tex_delimiters)
    blocks: list[str] = []
    pos = 0
    for m in _FENCE_RE.finditer(text):
        blocks.extend(_paragraphs(text[pos:m.start()], tex_delimiters))
        code = html.escape(m.group(1).rstrip("\n"))
        blocks.append(f'<pre class="ti-code"><code>{code}</code></pre>')
        pos = m.end()
    blocks.extend(_paragraphs(text[pos:], tex_delimiters))
    return "\n".join(blocks)


def _paragraphs(text: str, tex_delimiters: bool) -> list[str]:
    out = []
    for para in re.split(r"\n\s*\n", text.strip()):
        if para.strip():
            out.append(f"<p>{_inline(para.strip(), tex_delimiters)}</p>")
    return out


def _inline(text: str, tex_delimiters: bool) -> str:
    # Pull math and code out first so that escaping and bold leave them be.
    stash: list[str] = []

    def keep(s: str) -> str:
        stash.append(s)
        return f"\x00{len(stash) - 1}\x00"

    def display_math(m: re.Match) -> str:
        body = html.escape(m.group(1), quote=False)
        return keep(rf"\[{body}\]" if tex_delimiters else f"$${body}$$")

    def inline_math(m: re.Match) -> str:
        body = html.escape(m.group(1), quote=False)
        return keep(rf"\({body}\)" if tex_delimiters else f"${body}$")

    text = _DISPLAY_MATH_RE.sub(display_math, text)
    text = _INLINE_MATH_RE.sub(inline_math, text)
    text = _CODE_RE.sub(
        lambda m: keep(f"<code>{html.escape(m.group(1))}</code>"), text)
    text = html.escape(text, quote=False)
    text = _BOLD_RE.sub(r"<strong>\1</strong>", text)
    text = _EM_RE.sub(r"<em>\1</em>", text)
    return re.sub("\x00(\\d+)\x00", lambda m: stash[int(m.group(1))], text)
