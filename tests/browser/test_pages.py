"""Every page of the built book, as a reader's browser shows it.

Run after the book is built (``make test`` does both). Each page is loaded
from a local server in headless Chromium and audited (see ``audit.py``);
a screenshot of its first screen goes to ``_build/screenshots/`` for a
maintainer to look at, or of the whole page with ``BOOK_SCREENSHOTS=full``
(``make screenshots``). A full-page capture of a chapter (20,000-42,000 px
tall) costs about as much as the whole audit and checks nothing, so the
suite does not take it by default.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import yaml

from audit import audit_page, colab_links
from conftest import ROOT, SCREENSHOTS, SITE

pytestmark = pytest.mark.browser

sys.path.insert(0, str(ROOT / "scripts"))
from sync_setup_cells import repo_parts  # noqa: E402

CONFIG = yaml.safe_load((ROOT / "_config.yml").read_text())
FULL_SCREENSHOTS = os.environ.get("BOOK_SCREENSHOTS") == "full"


TOC = yaml.safe_load((ROOT / "_toc.yml").read_text())
TOC_FILES = [TOC["root"]] + [c["file"] for part in TOC.get("parts", [])
                             for c in part["chapters"]]
# Site-relative paths of the pages the book is made of.
PAGES = ["genindex.html", "search.html"] + [
    f + ".html" for f in TOC_FILES]
# Chapters are the notebooks listed in the table of contents.
CHAPTERS = [Path(f).name for f in TOC_FILES
            if (ROOT / f"{f}.ipynb").exists()]


@pytest.mark.parametrize("rel", PAGES)
def test_page_has_no_problems(site, page, rel):
    assert (SITE / rel).exists(), f"{rel} was not built"
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    shot = SCREENSHOTS / (rel.replace("/", "__").replace(".html", ".png"))
    report = audit_page(page, f"{site.url}/{rel}", screenshot=str(shot),
                        full_page=FULL_SCREENSHOTS)
    assert report.problems == [], "\n".join(report.problems)


def test_index_redirects_to_the_intro(site, page):
    page.goto(f"{site.url}/index.html")
    page.wait_for_url(f"{site.url}/{TOC['root']}.html", timeout=10000)
    assert page.title().startswith("Transformer Internals")


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_colab_links_open_this_chapter(fresh_page, chapter):
    slug, branch, _ = repo_parts(CONFIG)
    colab = CONFIG["launch_buttons"]["colab_url"].rstrip("/")
    want = f"{colab}/github/{slug}/blob/{branch}/book/{chapter}.ipynb"
    page = fresh_page(f"book/{chapter}.html")
    links = colab_links(page)
    assert links, "no Colab link on the page"
    assert set(links) == {want}, links
    # Both the header's launch button and the badge in the first cell.
    count = page.locator(f'a[href="{want}"]').count()
    assert count >= 2, f"expected launch button and badge, found {count}"
    assert (ROOT / "book" / f"{chapter}.ipynb").exists()


CHAPTER_PAGE_BUDGET = 3 * 1024 * 1024   # bytes: HTML + its images


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_chapter_page_weight(chapter):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from page_weight import page_weight
    weight = page_weight(SITE, f"book/{chapter}.html")
    assert weight.total <= CHAPTER_PAGE_BUDGET, (
        f"{chapter}: {weight.total / 2**20:.2f} MB (HTML "
        f"{weight.html_bytes} B + images {weight.image_bytes} B) > 3 MB")


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_no_exercise_answer_is_readable_without_a_click(fresh_page, chapter):
    """The code that builds an exercise holds its answer (``answer=``,
    ``solution=``): on a freshly loaded page no such source may be
    visible; it may sit behind a collapsed toggle (issue 13)."""
    page = fresh_page(f"book/{chapter}.html")
    sources = page.locator("div.cell_input", has_text="Exercise(")
    assert sources.count() > 0, "no exercise cell found: selector stale?"
    for i in range(sources.count()):
        src = sources.nth(i)
        code = src.locator("pre")
        visible = code.count() and code.first.is_visible()
        assert not visible, (
            f"exercise source visible without a click: "
            f"{src.inner_text()[:120]!r}")
