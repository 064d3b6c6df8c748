"""Measure the course's performance budgets and update benchmarks/results.md.

Each table this script measures replaces the section of results.md with
the same title (the heading up to its first parenthesis); a new table is
added at the end, and every other section (``make test`` timings,
accessibility, mutation testing ...) is kept as it is.

Budgets (DESIGN.md): each chapter executes in <= 60 s on a 2-core CPU; the
whole book builds from a fresh clone in <= 5 minutes. Chapter numbers that
are measurements (e.g. RNN steps vs one attention computation) are also
produced here, as ratios measured in one run.

Chapters are also timed with one core kept busy by another process
(small tensor ops on several threads spin-wait for each other and
a busy core made chapter 9 30x slower); the budget there is 2x the quiet
time. Those runs also go to ``benchmarks/load.md`` (``load_bench.py``).

Usage: ``python benchmarks/run.py`` (or ``make bench``);
``python benchmarks/run.py --load-only`` measures only the chapters, quiet
and with one core busy, and writes only ``benchmarks/load.md``.
"""
from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from page_weight import page_weight, shared_bytes  # noqa: E402
import all_to_all_bench  # noqa: E402
import kv_cache_bench  # noqa: E402
import load_bench  # noqa: E402
import mla_bench  # noqa: E402
import moe_bench  # noqa: E402
import quantization_bench  # noqa: E402
import serving_bench  # noqa: E402
import smollm2_bench  # noqa: E402
import speculative_bench  # noqa: E402
import training_bench  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results.md"
BUILD_BUDGET_S = 300.0


def cold_build() -> tuple[float, list[str]]:
    """Build the book into an empty folder: wall time and page-weight rows."""
    jb = Path(sys.executable).with_name("jupyter-book")
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        subprocess.run([str(jb), "build", str(ROOT), "--path-output", tmp,
                        "-W", "--keep-going", "-q"], check=True,
                       capture_output=True)
        seconds = time.perf_counter() - start
        return seconds, page_weight_rows(Path(tmp) / "_build" / "html")


def page_weight_rows(site: Path) -> list[str]:
    """Bytes per page (HTML + its images) and the shared assets, once."""
    rows = ["", "## Page weight (bytes a browser transfers)", "",
            "HTML plus the images it shows; the shared theme, scripts, fonts "
            "and MathJax under `_static/` are cached after the first page "
            "and counted once.", "",
            "| page | HTML (KB) | images (KB) | total (MB) | chapter budget "
            "3 MB |", "|---|---:|---:|---:|:---:|"]
    pages = sorted(p.relative_to(site).as_posix()
                   for p in site.rglob("*.html")
                   if "_static" not in p.parts and "_sources" not in p.parts)
    for rel in pages:
        w = page_weight(site, rel)
        chapter = rel.startswith("book/ch")
        verdict = ("yes" if w.total <= 3 * 2**20 else "NO") if chapter \
            else "-"
        rows.append(f"| `{rel}` | {w.html_bytes / 1024:.0f} | "
                    f"{w.image_bytes / 1024:.0f} | {w.total / 2**20:.2f} | "
                    f"{verdict} |")
    rows.append(f"| shared `_static/` (once) | | | "
                f"{shared_bytes(site) / 2**20:.2f} | - |")
    return rows


def rnn_vs_attention_rows() -> list[str]:
    """Chapter 1: sequential RNN steps vs one attention computation."""
    from course_lib.experiments.sequential_cost import time_recurrence_vs_attention
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


def attention_rows() -> list[str]:
    """Chapter 3: explicit attention vs torch's fused kernel, and A's bytes."""
    from course_lib.experiments.attention_cost import time_attention
    rows = ["", "## Chapter 3: explicit vs fused attention (CPU, B=1, H=8, "
            "d_k=64, one run)", "",
            "Budget: the explicit path within 3x of the fused "
            "one at L = 512.", "",
            "| length L | explicit (s) | fused (s) | explicit / fused | "
            "bytes of the L x L weights |",
            "|---:|---:|---:|---:|---:|"]
    for r in time_attention([128, 512, 2048], repeats=3):
        rows.append(f"| {r.length} | {r.explicit_seconds:.5f} | "
                    f"{r.fused_seconds:.5f} | {r.ratio:.2f} | "
                    f"{r.weights_bytes:,} |")
    return rows


def training_rows() -> list[str]:
    """Chapter 7: training throughput and the LM's gap to its floor."""
    r = training_bench.benchmark_chapter7()
    return ["", "## Chapter 7: training on this CPU (one run each)", "",
            "| quantity | value |", "|---|---:|",
            f"| decoder-only LM, training tokens/s | "
            f"{r['lm_tokens_per_s']:,.0f} |",
            f"| encoder-decoder (toy translation), target tokens/s | "
            f"{r['translation_tokens_per_s']:,.0f} |",
            f"| LM final validation loss (nats/token) | "
            f"{r['lm_val_loss']:.4f} |",
            f"| exact entropy rate of the language (floor) | "
            f"{r['entropy_rate']:.4f} |",
            f"| gap to the floor (nats/token) | {r['lm_gap_nats']:.4f} |",
            f"| gap to the true model on the same tokens | "
            f"{r['lm_gap_to_val_floor']:.4f} |",
            f"| translation, held-out exact match | "
            f"{r['translation_exact_match']:.4f} |"]


def section_key(heading: str) -> str:
    """'## Book build (2026-12-01)' -> 'Book build': a section's title
    without its parenthesised details (dates, settings)."""
    return heading.lstrip("#").split(" (")[0].strip()


def merge_sections(text: str, lines: list[str]) -> str:
    """``text`` (a markdown file of ``## `` sections) with each section of
    ``lines`` replacing the one with the same :func:`section_key`, or
    appended when the file has none."""
    def split(rows):
        head, sections = [], []
        for row in rows:
            if row.startswith("## "):
                sections.append([row])
            elif sections:
                sections[-1].append(row)
            else:
                head.append(row)
        return head, sections

    head, old = split(text.rstrip("\n").split("\n"))
    _, new = split(lines)
    fresh = {section_key(s[0]): s for s in new}
    merged = []
    for sec in old:
        merged.append(fresh.pop(section_key(sec[0]), sec))
    merged += [s for s in new if section_key(s[0]) in fresh]
    out = head + [row for sec in merged for row in sec]
    return "\n".join(out).rstrip("\n") + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--load-only", action="store_true",
                        help="only time the chapters quiet and with one "
                             "core busy; write only benchmarks/load.md")
    args = parser.parse_args(argv)
    notebooks = sorted((ROOT / "book").glob("*.ipynb"))
    # quiet and one-core-busy times of every chapter (also -> load.md)
    runs, ok = load_bench.run(notebooks)
    if args.load_only:
        return 0 if ok else 1
    table, _ = load_bench.rows(notebooks, runs)
    today = dt.date.today().isoformat()
    lines = [
        "", f"## Chapter execution (fresh kernel, {today})", "",
        f"Measured on {platform.machine()}, {os.cpu_count()} CPU cores, "
        f"Python {platform.python_version()}, torch {torch.__version__} "
        f"(`make bench`). Quiet: the machine as it is; busy: with one core "
        "kept busy by a background process (`benchmarks/load_bench.py`, "
        "also written to `benchmarks/load.md`). Load avg: the 1-minute load "
        "average at the start of the run.", ""] + table
    build, weight_rows = cold_build()
    ok &= build <= BUILD_BUDGET_S
    print(f"cold build: {build:.1f} s", flush=True)
    lines += ["", f"## Book build ({today})", "",
              f"| build | seconds | budget {BUILD_BUDGET_S:.0f} s |",
              "|---|---:|:---:|",
              f"| cold `jupyter-book build` (empty output folder) | "
              f"{build:.1f} | {'yes' if build <= BUILD_BUDGET_S else 'NO'} |"]
    lines += weight_rows
    lines += rnn_vs_attention_rows()
    lines += attention_rows()
    lines += training_rows()
    for bench in (kv_cache_bench, mla_bench, moe_bench, smollm2_bench,
                  all_to_all_bench, serving_bench, speculative_bench,
                  quantization_bench):
        lines += bench.rows()
        print(f"{bench.__name__}: done", flush=True)
    OUT.write_text(merge_sections(OUT.read_text(), lines))
    print(f"updated {OUT}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
