"""Print notebooks longest-running first, for `make test-notebooks`.

nbval runs one notebook per pytest-xdist worker (``--dist loadfile``),
handing out notebooks in the order given. Started last, the longest
chapter would keep one worker busy while the other idles; started first,
the short ones fill in around it (longest-processing-time-first). The
run time of each notebook is read from its own stored outputs: the
``execution`` timestamps Jupyter writes into every executed code cell
(``iopub.execute_input`` to ``shell.execute_reply``), so the order
follows the chapters as they are, with no list to keep up to date. A
notebook without timestamps counts as 0 s; ties keep the name order.

``--fill SECONDS`` prints instead the notebooks that one worker runs
beside the unit tests in ``make test`` (while the other core runs them):
going longest first, each notebook that still fits in SECONDS of recorded
time. ``make test`` gives the rest to the two workers afterwards.

Usage: ``python scripts/notebook_order.py [--fill SECONDS] book/*.ipynb``
"""
from __future__ import annotations

import json
import sys
from datetime import datetime


def _when(stamp: str) -> datetime:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00"))


def recorded_seconds(path: str) -> float:
    """Seconds the notebook's code cells took when it was last executed."""
    with open(path, encoding="utf-8") as f:
        cells = json.load(f).get("cells", [])
    total = 0.0
    for cell in cells:
        ex = cell.get("metadata", {}).get("execution", {})
        if "iopub.execute_input" in ex and "shell.execute_reply" in ex:
            total += (_when(ex["shell.execute_reply"])
                      - _when(ex["iopub.execute_input"])).total_seconds()
    return total


def longest_first(paths: list[str]) -> list[str]:
    return sorted(sorted(paths), key=recorded_seconds, reverse=True)


def fill(paths: list[str], seconds: float) -> list[str]:
    """Longest first, the notebooks that fit in ``seconds`` together."""
    chosen, left = [], seconds
    for path in longest_first(paths):
        if recorded_seconds(path) <= left:
            chosen.append(path)
            left -= recorded_seconds(path)
    return chosen


def main(args: list[str]) -> None:
    if args[:1] == ["--fill"]:
        print(" ".join(fill(args[2:], float(args[1]))))
    else:
        print(" ".join(longest_first(args)))


if __name__ == "__main__":
    main(sys.argv[1:])
