"""Chapter times on a busy machine: quiet vs one core kept busy.

Learners run the chapters on shared Colab machines and busy laptops. With
torch's default of one intra-op thread per core, a loop of *small* tensor
ops (token-by-token decoding, tiny-model training steps) runs each op on
all threads, which spin-wait for each other at the end of every op; when
another process holds one core, the spinning thread waits for a thread
that is not running, and chapter 9 went from 41 s to 1,243 s. This script
measures every chapter in a fresh kernel twice, interleaved: on the machine
as it is ("quiet"), and with one core kept busy by a background
``while True: pass`` process ("loaded"), with the 1-minute load average at
the start of each run, and writes ``benchmarks/load.md``.

The machine is rarely truly quiet (other processes run too), so the load
average is recorded with every time: read "quiet" as "without our extra
busy process".

Usage: ``python benchmarks/load_bench.py [--timeout S] [--baseline DIR]
[NOTEBOOK ...]`` (also ``python benchmarks/run.py --load-only``).
``make bench`` runs it after the other measurements. ``--baseline DIR``
also times every chapter, interleaved, as it is in DIR, a copy of another
commit (``git archive main | tar -x -C DIR``): its ``book/`` notebook with
its ``course_lib``, to compare a change with what it replaces.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import os
import platform
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellTimeoutError

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "load.md"
CHAPTER_BUDGET_S = 60.0      # DESIGN.md: each chapter <= 60 s on 2 cores
LOAD_RATIO_BUDGET = 2.0      # a chapter <= 2x its quiet time, one core busy
DEFAULT_TIMEOUT_S = 600.0    # a run is cut off (and reported as ">") here
BUSY_LOOP = "while True: pass"


@contextlib.contextmanager
def busy_core() -> Iterator[subprocess.Popen]:
    """Keep one core busy with a background Python busy-loop.

    The process is killed on leaving the block, whatever happens inside
    it (exceptions and KeyboardInterrupt included).
    """
    proc = subprocess.Popen([sys.executable, "-c", BUSY_LOOP],
                            stdin=subprocess.DEVNULL)
    try:
        time.sleep(0.5)  # let it get scheduled before timing starts
        yield proc
    finally:
        proc.kill()
        proc.wait()


@dataclass
class Run:
    seconds: float
    timed_out: bool
    load1: float  # 1-minute load average when the run started
    slowest: tuple[int, float] = (0, 0.0)  # (cell number, seconds)

    def __str__(self) -> str:
        return f"{'>' if self.timed_out else ''}{self.seconds:.1f}"


def time_notebook(path: Path, *, timeout_s: float = DEFAULT_TIMEOUT_S,
                  preamble: str | None = None,
                  env: dict[str, str] | None = None) -> Run:
    """Wall time of ``path`` in a fresh kernel; outputs are discarded.

    Args:
        path: the notebook; it runs with its own folder as working
            directory, as nbval and ``make notebooks`` run it.
        timeout_s: the whole run is cut off after this many seconds (the
            kernel is interrupted and shut down); ``Run.timed_out`` says so.
        preamble: optional code run first (after the setup cell), e.g.
            :func:`baseline_preamble`.
        env: extra environment variables for the kernel.
    """
    nb = nbformat.read(path, as_version=4)
    if preamble:
        nb.cells.insert(2, nbformat.v4.new_code_cell(preamble))
    deadline = time.perf_counter() + timeout_s  # reset when the run starts

    def remaining(cell) -> int:
        """nbclient's per-cell timeout: what is left of the whole run."""
        return max(1, int(deadline - time.perf_counter()))

    client = NotebookClient(nb, timeout_func=remaining, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}},
                            store_widget_state=False)
    saved = {k: os.environ.get(k) for k in (env or {})}
    os.environ.update(env or {})
    load1 = os.getloadavg()[0]
    timed_out = False
    try:
        start = time.perf_counter()
        deadline = start + timeout_s
        client.execute()
    except CellTimeoutError:
        timed_out = True
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return Run(time.perf_counter() - start, timed_out, load1,
               _slowest_cell(nb, skip=1 if preamble else 0))


def _slowest_cell(nb, *, skip: int) -> tuple[int, float]:
    """(1-based cell number in the chapter, seconds) of the slowest cell,
    from the timestamps nbclient records; ``skip`` inserted cells."""
    best = (0, 0.0)
    cells = nb.cells[:2] + nb.cells[2 + skip:]
    for number, cell in enumerate(cells, start=1):
        stamps = cell.get("metadata", {}).get("execution", {})
        try:
            seconds = (dt.datetime.fromisoformat(
                stamps["shell.execute_reply"].replace("Z", "+00:00"))
                - dt.datetime.fromisoformat(
                stamps["iopub.execute_input"].replace("Z", "+00:00"))
            ).total_seconds()
        except KeyError:
            continue
        best = max(best, (number, seconds), key=lambda b: b[1])
    return best


def baseline_preamble(folder: Path) -> str:
    """Code that makes a kernel import ``course_lib`` from ``folder``.

    The project's ``.venv`` installs course_lib in editable mode through an
    import hook that comes before ``sys.path``; the hook is removed first.
    """
    folder = Path(folder).resolve()
    return (
        "import sys\n"
        "sys.meta_path[:] = [f for f in sys.meta_path if '__editable__' "
        "not in getattr(f, '__module__', '') + getattr(f, '__name__', '')]\n"
        f"sys.path.insert(0, {str(folder)!r})\n"
        "import course_lib\n"
        f"assert course_lib.__file__.startswith({str(folder)!r}), "
        "course_lib.__file__\n")


def measure(paths: list[Path], *, timeout_s: float = DEFAULT_TIMEOUT_S,
            baseline: Path | None = None) -> list[dict[str, Run]]:
    """Quiet and loaded times of each notebook, the runs back to back.

    Returns one dict per notebook with the keys ``quiet`` and ``loaded``
    (and ``baseline quiet``, ``baseline loaded`` with ``baseline``, the
    folder of a copy of another commit).
    """
    results = []
    for path in paths:
        variants = {"": (path, None)}
        if baseline is not None:
            variants = {"baseline ": (Path(baseline) / "book" / path.name,
                                      baseline_preamble(baseline)),
                        "": (path, None)}
        runs = {}
        for condition in ("quiet", "loaded"):
            for prefix, (nb_path, preamble) in variants.items():
                with (busy_core() if condition == "loaded"
                      else contextlib.nullcontext()):
                    run = time_notebook(nb_path, timeout_s=timeout_s,
                                        preamble=preamble)
                runs[prefix + condition] = run
                print(f"{path.name}: {prefix}{condition} {run} s "
                      f"(load {run.load1:.2f})", flush=True)
        results.append(runs)
    return results


def rows(paths: list[Path], results: list[dict[str, Run]]
         ) -> tuple[list[str], bool]:
    """Markdown table rows and whether every chapter is within budget."""
    lines = [f"| chapter | quiet (s) | load avg | one core busy (s) | "
             f"load avg | busy / quiet | slowest cell, busy (s) | quiet <= "
             f"{CHAPTER_BUDGET_S:.0f} s and busy <= "
             f"{LOAD_RATIO_BUDGET:.0f}x quiet |",
             "|---|---:|---:|---:|---:|---:|---:|:---:|"]
    ok = True
    for path, runs in zip(paths, results):
        quiet, loaded = runs["quiet"], runs["loaded"]
        ratio = loaded.seconds / quiet.seconds
        within = (not quiet.timed_out and not loaded.timed_out
                  and quiet.seconds <= CHAPTER_BUDGET_S
                  and ratio <= LOAD_RATIO_BUDGET)
        ok &= within
        lines.append(f"| `{path.name}` | {quiet} | {quiet.load1:.2f} | "
                     f"{loaded} | {loaded.load1:.2f} | "
                     f"{'>' if loaded.timed_out else ''}{ratio:.2f} | "
                     f"cell {loaded.slowest[0]}: {loaded.slowest[1]:.1f} | "
                     f"{'yes' if within else 'NO'} |")
    return lines, ok


def baseline_rows(paths: list[Path], results: list[dict[str, Run]]
                  ) -> list[str]:
    """The baseline's times next to this tree's, from the same runs."""
    lines = ["| chapter | baseline quiet (s) | load avg | baseline busy (s) "
             "| load avg | busy / quiet | this tree quiet (s) | this tree "
             "busy (s) |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for path, runs in zip(paths, results):
        bq, bl = runs["baseline quiet"], runs["baseline loaded"]
        lines.append(f"| `{path.name}` | {bq} | {bq.load1:.2f} | {bl} | "
                     f"{bl.load1:.2f} | {'>' if bl.timed_out else ''}"
                     f"{bl.seconds / bq.seconds:.2f} | {runs['quiet']} | "
                     f"{runs['loaded']} |")
    return lines


def report(paths: list[Path], results: list[dict[str, Run]], *,
           baseline: Path | None = None) -> tuple[list[str], bool]:
    """The lines of ``load.md`` and whether every chapter is in budget."""
    table, ok = rows(paths, results)
    lines = ["# Chapter times with one core busy", "",
             f"Measured {dt.date.today().isoformat()} on "
             f"{platform.machine()}, {os.cpu_count()} CPU cores, Python "
             f"{platform.python_version()} "
             "(`python benchmarks/load_bench.py`).", "",
             "Each chapter runs in a fresh kernel twice, back to back: on "
             "the machine as it is (\"quiet\"), then with one core kept busy "
             f"by a background `python -c \"{BUSY_LOOP}\"`. \"load avg\" is "
             "the 1-minute load average when the run started; above 0 the "
             "machine was busy with other work too, which makes both times "
             "noisy. `>` marks a run cut off at the timeout. The slowest "
             "cell of the busy run (numbered from 1 in the chapter; a cell "
             "cut off by the timeout is not counted) shows where the time "
             "went.", ""] + table
    if baseline is not None:
        lines += ["", "## Compared with a baseline", "",
                  f"The same chapters as they are in `{baseline}` (notebook "
                  "and course_lib), each baseline run right before the "
                  "matching run of this tree.", ""]
        lines += baseline_rows(paths, results)
    return lines, ok


def run(paths: list[Path], *, out: Path = OUT,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        baseline: Path | None = None) -> tuple[list[dict[str, Run]], bool]:
    """Measure ``paths``, write ``out`` (``load.md``); return the runs."""
    # make `kill` (SIGTERM) unwind like Ctrl-C, so busy_core's finally runs
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    results = measure(paths, timeout_s=timeout_s, baseline=baseline)
    lines, ok = report(paths, results, baseline=baseline)
    out.write_text("\n".join(lines) + "\n")
    print(f"wrote {out}")
    return results, ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", type=Path)
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S,
                        help="cut off one run after this many seconds")
    parser.add_argument("--baseline", type=Path, default=None,
                        help="copy of another commit to compare with")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    paths = args.notebooks or sorted((ROOT / "book").glob("*.ipynb"))
    _, ok = run(paths, out=args.out, timeout_s=args.timeout,
                baseline=args.baseline)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
