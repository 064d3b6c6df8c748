"""Re-execute notebooks in place so their stored outputs are current.

The stored outputs are what the HTML book shows and what nbval compares
against, so run this after changing a chapter or course_lib:
``python scripts/run_notebooks.py [NOTEBOOK ...]`` (default: all of book/).
Each notebook runs in a fresh kernel with ``book/`` as working directory,
exactly as nbval runs it. The wall time of each is printed. After the
run, every number the prose takes from a computation
(``<!--glue:name-->...<!--/glue-->``) is rewritten from the value the
notebook glued (``course_lib.notebook.glue``).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
from sync_setup_cells import load_config, sync  # noqa: E402

from course_lib.notebook.glue import fill_glue  # noqa: E402


def run(path: Path, timeout: int = 600) -> float:
    """Execute ``path`` in place; return the wall time in seconds."""
    sync(path, load_config(), check=False)
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb, timeout=timeout, kernel_name="python3",
        resources={"metadata": {"path": str(path.parent)}},
        # No widget state is stored: a frozen widget is a dead control in
        # the book, which shows each widget's HTML equivalent instead.
        store_widget_state=False)
    start = time.perf_counter()
    client.execute()
    elapsed = time.perf_counter() - start
    nb.metadata.pop("widgets", None)
    missing = fill_glue(nb)
    nbformat.write(nb, path)
    if missing:
        raise SystemExit(f"{path}: the prose uses glue names that no cell "
                         f"records: {', '.join(sorted(set(missing)))}")
    return elapsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", type=Path)
    args = parser.parse_args(argv)
    paths = args.notebooks or sorted((ROOT / "book").glob("*.ipynb"))
    for path in paths:
        print(f"{path}: {run(path):.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
