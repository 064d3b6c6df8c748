"""How readable the decoder is, measured: the files and lines a reader of
``DecoderLM`` meets, the share of argument checks among their code lines,
and the library's re-exports and cross-module private imports.

The decoder's files are the import closure of ``course_lib.model.decoder_lm``
inside ``course_lib``, every import counted (top level, inside functions
and under ``TYPE_CHECKING``), the private helper package ``_util``
excluded. A code line is a line of a statement that is not a docstring,
a comment or blank. A check line is a code line of: a ``raise``; an ``if``
whose body only raises (with its body); a call statement to
``check_*``/``_check*``; the body of a function named ``check_*`` or
``_check*``.

    python benchmarks/code_metrics.py
"""
from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path

LIB = Path(__file__).resolve().parents[1] / "course_lib"


def module_path(name: str) -> Path:
    return LIB.joinpath(*name.split(".")).with_suffix(".py")


def relative_imports(name: str):
    tree = ast.parse(module_path(name).read_text())
    package = name.split(".")[:-1]
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package[:len(package) - (node.level - 1)]
            target = base + (node.module.split(".") if node.module else [])
            if module_path(".".join(target)).exists():
                yield ".".join(target)
            else:
                for a in node.names:
                    if module_path(".".join(target + [a.name])).exists():
                        yield ".".join(target + [a.name])


def closure(name: str) -> list[str]:
    seen, todo = [], [name]
    while todo:
        m = todo.pop()
        if m in seen or m.startswith("_util"):
            continue
        seen.append(m)
        todo += list(relative_imports(m))
    return sorted(seen)


def code_and_check_lines(path: Path) -> tuple[int, int, int]:
    """(all lines, code lines, check lines) of one file."""
    src = path.read_text()
    tree = ast.parse(src)
    doc = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef,
                             ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(
                    first.value, ast.Constant) and isinstance(
                    first.value.value, str):
                doc.update(range(first.lineno, first.end_lineno + 1))
    comment_only = set()
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        if tok.type == tokenize.COMMENT and \
                src.splitlines()[tok.start[0] - 1].strip().startswith("#"):
            comment_only.add(tok.start[0])
    lines = src.splitlines()
    code = {i for i, l in enumerate(lines, 1)
            if l.strip() and i not in doc and i not in comment_only}
    check = set()

    def span(n):
        return set(range(n.lineno, n.end_lineno + 1))

    def is_check_name(f):
        name = f.id if isinstance(f, ast.Name) else \
            f.attr if isinstance(f, ast.Attribute) else ""
        return name.startswith(("check_", "_check"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Raise):
            check |= span(node)
        elif isinstance(node, ast.If) and not node.orelse and all(
                isinstance(b, ast.Raise) for b in node.body):
            check |= span(node)
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) \
                and is_check_name(node.value.func):
            check |= span(node)
        elif isinstance(node, ast.FunctionDef) and \
                node.name.startswith(("check_", "_check")):
            check |= span(node)
    return len(lines), len(code), len(check & code)


def reexports_and_private_imports() -> tuple[int, int]:
    """Names in a module's ``__all__`` not defined there; private names
    imported from another course_lib module."""
    reexp = private = 0
    for path in LIB.rglob("*.py"):
        if path.name == "__init__.py":
            continue
        tree = ast.parse(path.read_text())
        defined, exported = set(), []
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                defined.add(node.name)
            for t in getattr(node, "targets", [getattr(node, "target",
                                                        None)]):
                for n in ast.walk(t) if t is not None else []:
                    if isinstance(n, ast.Name):
                        defined.add(n.id)
                if isinstance(t, ast.Name) and t.id == "__all__":
                    exported = ast.literal_eval(node.value)
        reexp += len(set(exported) - defined)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level:
                private += sum(a.name.startswith("_") for a in node.names)
    return reexp, private


def main() -> None:
    files = closure("model.decoder_lm")
    rows, total = [], [0, 0, 0]
    for m in files:
        n = code_and_check_lines(module_path(m))
        rows.append((m, *n))
        total = [a + b for a, b in zip(total, n)]
    print("| module | lines | code lines | check lines |")
    print("|---|---:|---:|---:|")
    for m, a, c, k in rows:
        print(f"| `{m}` | {a} | {c} | {k} |")
    print(f"| **{len(files)} files** | **{total[0]}** | **{total[1]}** | "
          f"**{total[2]}** ({100 * total[2] / total[1]:.1f} %) |")
    reexp, private = reexports_and_private_imports()
    n_mod = sum(1 for p in LIB.rglob("*.py") if p.name != "__init__.py")
    print(f"\nmodules: {n_mod}; re-exports: {reexp}; private names imported "
          f"across modules: {private}")


if __name__ == "__main__":
    main()
