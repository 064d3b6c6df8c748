"""The library's layout, read from ``course_lib.CHAPTERS`` and the folders.

- Every module is listed in ``CHAPTERS`` once, or is course machinery
  (``notebook/``, ``_util/``), which no chapter's code depends on.
- A folder imports only the folders it builds on (``BUILDS_ON``): the model
  needs nothing but the private helpers, and nothing of the library needs
  the notebook machinery.
- Inside ``model/`` and ``generation/`` a module imports, at import time,
  only modules of its own or an earlier chapter: the model is built
  bottom-up in the order the book teaches it. (Imports for annotations
  only, under ``if TYPE_CHECKING:``, and imports inside a function, run
  only when a later chapter's object is passed in, are allowed.)
- One home per name: every name in a module's ``__all__`` is defined in
  that module, and no module imports another module's private name.
"""
import ast
from pathlib import Path

import pytest

import course_lib

LIB = Path(course_lib.__file__).resolve().parent
MACHINERY = {"notebook", "_util"}
BUILDS_ON = {
    "_util": set(),
    "notebook": {"_util"},
    "model": {"_util"},
    "training": {"_util"},
    "sizing": {"_util", "model"},
    "generation": {"_util", "model", "sizing"},
    "tasks": {"_util", "model", "training", "generation"},
    "experiments": {"_util", "model", "training", "tasks", "generation",
                    "sizing", "pretrained"},
    "pretrained": {"_util", "model", "sizing"},
    "distributed": {"_util", "model", "sizing"},
    "serving": {"_util", "model", "sizing", "generation", "pretrained"},
}
CHAPTER_OF = {m: ch for ch, mods in course_lib.CHAPTERS.items()
              for m in mods}
MODULES = {".".join(p.relative_to(LIB).with_suffix("").parts): p
           for p in sorted(LIB.rglob("*.py")) if p.name != "__init__.py"}


def folder(module: str) -> str:
    return module.split(".")[0]


def imports(module: str, *, top_level_only: bool = False):
    """(imported course_lib module, names, line) for each relative import."""
    path = MODULES[module]
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else ast.walk(tree)
    package = module.split(".")[:-1]
    for node in nodes:
        if not isinstance(node, ast.ImportFrom) or node.level == 0:
            continue
        base = package[:len(package) - (node.level - 1)]
        target = base + (node.module.split(".") if node.module else [])
        names = [a.name for a in node.names]
        if ".".join(target) in MODULES:
            yield ".".join(target), names, node.lineno
        else:                       # from .pkg import module
            for name in names:
                yield ".".join(target + [name]), [], node.lineno


def test_every_module_is_mapped_to_one_chapter_or_is_machinery():
    listed = [m for mods in course_lib.CHAPTERS.values() for m in mods]
    assert len(listed) == len(set(listed)), "a module listed twice"
    assert set(listed) <= set(MODULES), set(listed) - set(MODULES)
    unlisted = {m for m in MODULES if m not in CHAPTER_OF}
    assert {folder(m) for m in unlisted} <= MACHINERY, sorted(unlisted)
    assert sorted(course_lib.CHAPTERS) == list(range(1, 16))


@pytest.mark.parametrize("module", sorted(MODULES))
def test_a_folder_imports_only_what_it_builds_on(module):
    for dep, _, line in imports(module):
        assert dep in MODULES, f"{module} imports unknown {dep}"
        if folder(dep) != folder(module):
            assert folder(dep) in BUILDS_ON[folder(module)], (
                f"{module} imports {dep}, line {line}")


@pytest.mark.parametrize("module", sorted(
    m for m in MODULES if folder(m) in ("model", "generation")))
def test_the_model_is_built_in_chapter_order(module):
    own = CHAPTER_OF[module]
    for dep, _, line in imports(module, top_level_only=True):
        if folder(dep) in MACHINERY:
            continue
        assert CHAPTER_OF[dep] <= own, (
            f"{module} (chapter {own}) imports {dep} (chapter "
            f"{CHAPTER_OF[dep]}) at import time, line {line}")


@pytest.mark.parametrize("module", sorted(MODULES))
def test_every_public_name_has_one_home(module):
    tree = ast.parse(MODULES[module].read_text())
    defined, exported = set(), []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            defined.add(node.name)
        targets = (node.targets if isinstance(node, ast.Assign) else
                   [node.target] if isinstance(node, ast.AnnAssign) else [])
        for t in targets:
            for n in ast.walk(t):
                if isinstance(n, ast.Name):
                    defined.add(n.id)
            if isinstance(t, ast.Name) and t.id == "__all__":
                exported = ast.literal_eval(node.value)
    assert exported, f"{module} has no __all__"
    assert set(exported) <= defined, (
        f"{module} re-exports {sorted(set(exported) - defined)}")


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_private_name_crosses_modules(module):
    for dep, names, line in imports(module):
        private = [n for n in names if n.startswith("_")]
        assert not private, f"{module} imports {private} from {dep}, " \
                            f"line {line}"


def test_the_readme_map_is_chapters():
    """README's module map is the one ``scripts/module_map.py`` prints."""
    import subprocess
    import sys
    root = LIB.parent
    table = subprocess.run(
        [sys.executable, str(root / "scripts" / "module_map.py")],
        capture_output=True, text=True, check=True).stdout
    assert table.strip() in (root / "README.md").read_text(), (
        "README's module map is out of date: paste the output of "
        "python scripts/module_map.py")
