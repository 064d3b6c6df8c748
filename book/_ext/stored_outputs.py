"""Fail the (strict) build when a notebook's stored outputs are not sound.

The book renders stored outputs without executing anything
(``execute_notebooks: off``), so myst-nb's ``raise_on_error`` cannot fire.
This extension does its job on the stored outputs instead: a cell whose
stored output is an error, or a code cell that was never executed, is a
Sphinx warning, which ``-W`` turns into a failed build.
"""
import json
from pathlib import Path

from sphinx.application import Sphinx
from sphinx.util import logging

logger = logging.getLogger(__name__)


def check_notebook(path: Path) -> list[str]:
    """Problems with the stored outputs of one notebook."""
    nb = json.loads(path.read_text(encoding="utf-8"))
    problems = []
    for i, cell in enumerate(nb.get("cells", []), start=1):
        if cell.get("cell_type") != "code":
            continue
        source = "".join(cell.get("source", ""))
        tags = cell.get("metadata", {}).get("tags", [])
        if "remove-cell" in tags and "colab-setup" in tags:
            continue              # the Colab setup cell is not executed
        if source.strip() and cell.get("execution_count") is None:
            problems.append(f"cell {i} was never executed "
                            "(run `make notebooks`)")
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                problems.append(f"cell {i} stored an error: "
                                f"{out.get('ename')}: {out.get('evalue')}")
    return problems


def _check(app: Sphinx, env, docnames) -> None:
    for docname in docnames:
        path = Path(env.doc2path(docname))
        if path.suffix != ".ipynb":
            continue
        for problem in check_notebook(path):
            logger.warning("%s: %s", path.name, problem,
                           location=docname)


def setup(app: Sphinx) -> dict:
    app.connect("env-before-read-docs", _check)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
