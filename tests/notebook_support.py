"""Reading the book's notebooks from tests: the source of the one cell that
builds an exercise (tests that run a chapter's exercise outside Jupyter),
and every text of the book with where it is (prose checks)."""
import json
import pathlib
import re

BOOK = pathlib.Path(__file__).resolve().parent.parent / "book"


def exercise_cell(notebook: str, key: str) -> str:
    """Source of the single cell of ``book/notebook`` with ``key="key"``."""
    cells = json.loads((BOOK / notebook).read_text())["cells"]
    found = [c for c in cells if f'key="{key}"' in "".join(c["source"])]
    assert len(found) == 1, f"{notebook}: no single cell with {key!r}"
    return "".join(found[0]["source"])


def run_exercise_cell(source: str, namespace: dict) -> None:
    """Execute an exercise cell's ``source`` in ``namespace``, with the
    exercise it builds bound to ``namespace["EXERCISE"]``."""
    bound, n = re.subn(r"^(\w*Exercise)\(", r"EXERCISE = \1(", source,
                       count=1, flags=re.M)
    assert n == 1, "the cell builds no exercise"
    exec(bound, namespace)


def model_solution(exercise) -> str:
    """The first ```python block of an exercise's worked solution."""
    return exercise.solution.split("```python\n")[1].split("```")[0]


def book_texts(cell_type: str | None = None):
    """``(where, text)`` for every cell of every chapter notebook (only
    cells of ``cell_type``, e.g. ``"markdown"``, if given), then every
    ``book/*.md`` page."""
    for path in sorted(BOOK.glob("*.ipynb")):
        for i, cell in enumerate(json.loads(path.read_text())["cells"]):
            if cell_type in (None, cell["cell_type"]):
                yield f"{path.name} cell {i}", "".join(cell["source"])
    for path in sorted(BOOK.glob("*.md")):
        yield path.name, path.read_text()


def assert_mistake_caught(exercise, function, named: str | None) -> None:
    """A learner's wrong ``function`` fails ``exercise``'s check with
    feedback on a case, never a traceback, and names the mistake
    (``named``, a phrase of its message) when the exercise diagnoses it."""
    feedback = exercise.check(function)
    assert not feedback.correct
    assert "Case" in feedback.message and "Traceback" not in \
        feedback.message, feedback.message
    if named:
        assert "Likely mistake" in feedback.message and named in \
            feedback.message, feedback.message


def learner_function(exercise, source: str):
    """The function ``source`` defines under the exercise's name, loaded in
    this process by the exercise's own loader (the names the sandbox
    gives learner code: torch, np, math). A check of source code goes
    through the sandbox, which starts a Python that imports torch (a
    second or more each); tests of what the feedback says about a mistake
    pass the function instead (tests/test_sandbox.py and each chapter's
    solution test cover the sandboxed path)."""
    func = exercise._load(source)
    assert callable(func), func
    return func
