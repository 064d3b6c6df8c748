"""The library's layering rule (CONTRIBUTING, "Library style"): a module
imports, at import time, only modules of its own or an earlier chapter and
the shared helpers. Imports for annotations only (under
``if TYPE_CHECKING:``) and imports inside a function (run only when a
later chapter's object is passed in) are allowed.
"""
import ast
import re
from pathlib import Path

import pytest

LIB = Path(__file__).resolve().parents[1] / "course_lib"
HELPERS = {"validation", "timing", "training", "special_tokens", "threads",
           "widgets", "frames", "markdown", "source", "exercises",
           "exercise_base", "answers", "function_exercise", "i18n"}


def chapter_of(path: Path) -> int:
    m = re.search(r"Introduced in chapter (\d+)", path.read_text())
    assert m, f"{path.name} has no 'Introduced in chapter N'"
    return int(m.group(1))


MODULES = {p.stem: p for p in sorted(LIB.glob("*.py"))
           if p.stem != "__init__"}


def import_time_deps(path: Path) -> list[tuple[str, int]]:
    """course_lib modules imported at the top level of ``path``."""
    deps = []
    for node in ast.parse(path.read_text()).body:   # top level only
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module:
                deps.append((node.module.split(".")[0], node.lineno))
            else:
                deps += [(a.name, node.lineno) for a in node.names]
    return deps


def test_every_module_names_its_chapter():
    assert len(MODULES) > 20
    for path in MODULES.values():
        chapter_of(path)


@pytest.mark.parametrize("name", sorted(set(MODULES) - HELPERS))
def test_no_module_imports_a_later_chapter(name):
    own = chapter_of(MODULES[name])
    for dep, line in import_time_deps(MODULES[name]):
        if dep in HELPERS:
            continue
        assert chapter_of(MODULES[dep]) <= own, (
            f"{name}.py (chapter {own}) imports {dep} (chapter "
            f"{chapter_of(MODULES[dep])}) at import time, line {line}")


def test_helpers_import_no_chapter_module_but_each_other():
    for name in HELPERS:
        for dep, line in import_time_deps(MODULES[name]):
            assert dep in HELPERS, f"{name}.py imports {dep}, line {line}"
