"""Per-module summary of the last `mutmut run` (read from mutants/*.meta).

    python scripts/mutation_report.py attention sampling ...

Prints a markdown table (killed / total checked and the score) and the
surviving mutants; `mutmut show NAME` prints a survivor's diff.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

KILLED = {1, 3}               # mutmut: pytest failed (1) or errored (3)
TIMEOUT = {36, -24, 24, 152, 255}


def summary(module: str) -> tuple[dict, list[str]]:
    meta = (Path("mutants") / "course_lib" /
            f"{module.replace('.', '/')}.py.meta")
    if not meta.is_file():
        raise SystemExit(f"{meta} not found: run `make mutation` first")
    codes = json.loads(meta.read_text())["exit_code_by_key"]
    count = {"killed": 0, "timeout": 0, "survived": 0, "no tests": 0,
             "not checked": 0, "other": 0}
    survivors = []
    for name, code in sorted(codes.items()):
        if code is None:
            count["not checked"] += 1
        elif code in KILLED:
            count["killed"] += 1
        elif code in TIMEOUT:
            count["timeout"] += 1      # an infinite loop: the tests notice
        elif code == 0:
            count["survived"] += 1
            survivors.append(name)
        elif code in (5, 33):
            count["no tests"] += 1
            survivors.append(name + "  (no test calls it)")
        else:
            count["other"] += 1
    return count, survivors


def main(modules: list[str]) -> None:
    print("| module | killed | timeout | survived | no tests | checked "
          "| score |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    all_survivors = []
    for module in modules:
        c, survivors = summary(module)
        checked = sum(c.values()) - c["not checked"]
        dead = c["killed"] + c["timeout"]
        score = f"{100 * dead / checked:.1f} %" if checked else "-"
        print(f"| {module} | {c['killed']} | {c['timeout']} | "
              f"{c['survived']} | {c['no tests']} | {checked} | {score} |")
        all_survivors += survivors
    print("\nSurvivors:")
    for name in all_survivors:
        print("  ", name)


if __name__ == "__main__":
    main(sys.argv[1:])
