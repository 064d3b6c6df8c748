"""Count each chapter's checked exercises by purpose (recall /
application / prediction / transfer), read from the notebooks' stored
outputs (each exercise's page HTML carries ``data-purpose``).

Usage: ``python scripts/exercise_census.py`` prints a Markdown table.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PURPOSES = ("recall", "application", "prediction", "transfer")
FOUND = re.compile(r'id="ti-ex-([^"]+)" data-purpose="([a-z]+)"')


def census(path: Path) -> dict[str, list[str]]:
    """purpose -> the keys of the notebook's exercises with it."""
    out: dict[str, list[str]] = {p: [] for p in PURPOSES}
    for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
        for output in cell.get("outputs", []):
            html = output.get("data", {}).get("text/html", "")
            html = "".join(html) if isinstance(html, list) else html
            for key, purpose in dict(FOUND.findall(html)).items():
                out[purpose].append(key)
    return out


def main() -> None:
    print("| chapter | " + " | ".join(PURPOSES) + " | total |")
    print("|---|" + "---:|" * (len(PURPOSES) + 1))
    totals = dict.fromkeys(PURPOSES, 0)
    for path in sorted((ROOT / "book").glob("ch*.ipynb")):
        c = census(path)
        for p in PURPOSES:
            totals[p] += len(c[p])
        print(f"| {path.stem[:4]} | "
              + " | ".join(str(len(c[p])) for p in PURPOSES)
              + f" | {sum(len(v) for v in c.values())} |")
    print("| all | " + " | ".join(str(totals[p]) for p in PURPOSES)
          + f" | {sum(totals.values())} |")


if __name__ == "__main__":
    main()
