"""Measure the course's performance budgets and write benchmarks/results.md.

Budgets (DESIGN.md): each chapter executes in <= 60 s on a 2-core CPU; the
whole book builds from a fresh clone in <= 5 minutes. Chapter numbers that
are measurements (e.g. RNN steps vs one attention computation) are also
produced here, as ratios measured in one run.

Usage: ``python benchmarks/run.py`` (or ``make bench``).
"""
from __future__ import annotations

import datetime as dt
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat
import torch
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results.md"
CHAPTER_BUDGET_S = 60.0
BUILD_BUDGET_S = 300.0


def time_notebook(path: Path) -> float:
    """Wall time of one notebook in a fresh kernel (outputs discarded)."""
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}},
                            store_widget_state=False)
    start = time.perf_counter()
    client.execute()
    return time.perf_counter() - start


def time_cold_build() -> float:
    """Wall time of a book build into an empty output folder."""
    jb = Path(sys.executable).with_name("jupyter-book")
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        subprocess.run([str(jb), "build", str(ROOT), "--path-output", tmp,
                        "-W", "--keep-going", "-q"], check=True,
                       capture_output=True)
        return time.perf_counter() - start


def rnn_vs_attention_rows() -> list[str]:
    """Chapter 1: sequential RNN steps vs one attention computation."""
    try:
        from course_lib.rnn import time_recurrence_vs_attention
    except ImportError:
        return []
    rows = ["", "## Chapter 1: sequential recurrence vs one attention "
            "computation", "",
            "| length T | RNN (s) | attention (s) | RNN / attention |",
            "|---:|---:|---:|---:|"]
    for r in time_recurrence_vs_attention([64, 256, 1024], d_model=64,
                                          batch=8, repeats=5):
        rows.append(f"| {r.length} | {r.rnn_seconds:.5f} | "
                    f"{r.attention_seconds:.5f} | "
                    f"{r.rnn_seconds / r.attention_seconds:.1f} |")
    return rows


def main() -> int:
    notebooks = sorted((ROOT / "book").glob("*.ipynb"))
    lines = [
        "# Benchmark results", "",
        f"Measured {dt.date.today().isoformat()} on {platform.machine()}, "
        f"{os.cpu_count()} CPU cores, Python {platform.python_version()}, "
        f"torch {torch.__version__} (`make bench`).", "",
        "## Chapter execution (fresh kernel)", "",
        f"| chapter | seconds | budget {CHAPTER_BUDGET_S:.0f} s |",
        "|---|---:|:---:|"]
    ok = True
    for path in notebooks:
        seconds = time_notebook(path)
        within = seconds <= CHAPTER_BUDGET_S
        ok &= within
        lines.append(f"| `{path.name}` | {seconds:.1f} | "
                     f"{'yes' if within else 'NO'} |")
        print(f"{path.name}: {seconds:.1f} s", flush=True)
    build = time_cold_build()
    ok &= build <= BUILD_BUDGET_S
    print(f"cold build: {build:.1f} s", flush=True)
    lines += ["", "## Book build", "",
              f"| build | seconds | budget {BUILD_BUDGET_S:.0f} s |",
              "|---|---:|:---:|",
              f"| cold `jupyter-book build` (empty output folder) | "
              f"{build:.1f} | {'yes' if build <= BUILD_BUDGET_S else 'NO'} |"]
    lines += rnn_vs_attention_rows()
    OUT.write_text("\n".join(lines) + "\n")
    print(f"wrote {OUT}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
