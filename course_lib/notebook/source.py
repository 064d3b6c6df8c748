"""Printing library source in a chapter: :func:`show_source` prints a
course_lib function as the chapter needs it, without its docstring and
argument checks, so the printed code is the idea itself.
"""
from __future__ import annotations

import ast
from typing import Any, Callable

from .._util.validation import check_bool

__all__ = ["show_source", "source_lines"]


def show_source(fn: Callable[..., Any], *, checks: bool = False) -> None:
    """Print a course_lib function's source (dedented), docstring and
    argument checks removed.

    Chapters show the library's code instead of retyping it. The docstring
    repeats what the surrounding prose explains, and the argument checks
    (``check_*(...)`` calls and ``if ...: raise`` guards at the top level
    of the body) are what every public function does before its idea
    starts; both are left out so the printed code is the idea itself.
    One comment line marks where checks were removed.

    Args:
        fn: a function or method.
        checks: keep the argument checks (print the full body).
    """
    print(source_lines(fn, checks=checks))


def _is_check(node: ast.stmt) -> bool:
    """An argument check: ``check_x(...)``/``_check_x(...)``/``self._check
    (...)`` as a statement, or an ``if`` whose body only raises or checks
    (``if positions is not None: check_x(...)``)."""
    if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
        f = node.value.func
        name = f.id if isinstance(f, ast.Name) else \
            f.attr if isinstance(f, ast.Attribute) else ""
        return name.startswith(("check_", "_check"))
    return (isinstance(node, ast.If) and not node.orelse
            and all(isinstance(b, ast.Raise) or _is_check(b)
                    for b in node.body))


def source_lines(fn: Callable[..., Any], *, checks: bool = False) -> str:
    """The text :func:`show_source` prints (see there).
    """
    import inspect
    import textwrap
    check_bool("checks", checks)
    src = textwrap.dedent(inspect.getsource(fn))  # methods start at col 0
    lines = src.splitlines()
    body = ast.parse(src).body[0].body
    hidden: dict[int, int] = {}          # first line -> last line (1-based)
    first = body[0]
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
            and isinstance(first.value.value, str):
        hidden[first.lineno] = first.end_lineno      # the docstring
        body = body[1:]
    check_starts = set()
    if not checks:
        for node in filter(_is_check, body):
            start = node.lineno
            # a comment right above a check explains the check: it goes too
            while start > 1 and lines[start - 2].lstrip().startswith("#") \
                    and start - 1 not in hidden:
                start -= 1
            hidden[start] = node.end_lineno
            check_starts.add(start)
    out, skip_until = [], 0
    for i, line in enumerate(lines, start=1):
        if i <= skip_until:
            continue
        if i in hidden:
            skip_until = hidden[i]
            if i == min(check_starts, default=0):    # mark the first cut
                indent = line[:len(line) - len(line.lstrip())]
                out.append(f"{indent}# (argument checks left out)")
            continue
        out.append(line)
    return "\n".join(out) + "\n"
