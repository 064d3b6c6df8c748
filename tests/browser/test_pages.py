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
import re
import sys
from pathlib import Path

import pytest
import yaml

from audit import colab_links, inspect
from conftest import ROOT, SCREENSHOTS, SITE

pytestmark = pytest.mark.browser

sys.path.insert(0, str(ROOT / "scripts"))
from sync_setup_cells import repo_parts  # noqa: E402

CONFIG = yaml.safe_load((ROOT / "_config.yml").read_text())
FULL_SCREENSHOTS = os.environ.get("BOOK_SCREENSHOTS") == "full"


TOC = yaml.safe_load((ROOT / "_toc.yml").read_text())
TOC_FILES = [TOC["root"]] + [c["file"] for part in TOC.get("parts", [])
                             for c in part["chapters"]]
# The English book at the site's root, the Chinese one under zh/: every
# check runs on the pages of both.
PREFIX = {"en": "", "zh": "zh/"}
# Site-relative paths of the pages the book is made of, in both languages.
PAGES = [PREFIX[lang] + p for lang in PREFIX
         for p in ["genindex.html", "search.html"]
         + [f + ".html" for f in TOC_FILES]]
# Chapters are the notebooks listed in the table of contents.
CHAPTERS = [Path(f).name for f in TOC_FILES
            if (ROOT / f"{f}.ipynb").exists()]
CHAPTER_PAGES = [f"{PREFIX[lang]}book/{c}.html" for lang in PREFIX
                 for c in CHAPTERS]


def language_of(rel: str) -> str:
    return "zh" if rel.startswith(PREFIX["zh"]) else "en"


def chapter_of(rel: str) -> str:
    return Path(rel).stem


@pytest.mark.parametrize("rel", PAGES)
def test_page_has_no_problems(audited_page, rel):
    """The audit (audit.py) of the page's shared desktop load: what went
    wrong while it loaded, then the checks of the loaded page."""
    assert (SITE / rel).exists(), f"{rel} was not built"
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    shot = SCREENSHOTS / (rel.replace("/", "__").replace(".html", ".png"))
    page, report = audited_page(rel)
    inspect(page, report, screenshot=str(shot), full_page=FULL_SCREENSHOTS)
    assert report.problems == [], "\n".join(report.problems)


TITLES = {"en": "Transformer Internals", "zh": "Transformer 内部原理"}


@pytest.mark.parametrize("lang", PREFIX)
def test_index_redirects_to_the_intro(site, page, lang):
    page.goto(f"{site.url}/{PREFIX[lang]}index.html")
    page.wait_for_url(f"{site.url}/{PREFIX[lang]}{TOC['root']}.html",
                      timeout=10000)
    assert page.title().endswith(TITLES[lang]), page.title()


@pytest.mark.parametrize("rel", CHAPTER_PAGES)
def test_colab_links_open_this_chapter(fresh_page, rel):
    """The launch button and the badge open this chapter's notebook, the
    Chinese one (zh/book/...) on a Chinese page."""
    slug, branch, _ = repo_parts(CONFIG)
    colab = CONFIG["launch_buttons"]["colab_url"].rstrip("/")
    chapter, folder = chapter_of(rel), PREFIX[language_of(rel)] + "book"
    want = f"{colab}/github/{slug}/blob/{branch}/{folder}/{chapter}.ipynb"
    page = fresh_page(rel)
    links = colab_links(page)
    assert links, "no Colab link on the page"
    assert set(links) == {want}, links
    # Both the header's launch button and the badge in the first cell.
    count = page.locator(f'a[href="{want}"]').count()
    assert count >= 2, f"expected launch button and badge, found {count}"
    assert (ROOT / folder / f"{chapter}.ipynb").exists()


CHAPTER_PAGE_BUDGET = 3 * 1024 * 1024   # bytes: HTML + its images


@pytest.mark.parametrize("rel", CHAPTER_PAGES)
def test_chapter_page_weight(rel):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from page_weight import page_weight
    weight = page_weight(SITE, rel)
    assert weight.total <= CHAPTER_PAGE_BUDGET, (
        f"{rel}: {weight.total / 2**20:.2f} MB (HTML "
        f"{weight.html_bytes} B + images {weight.image_bytes} B) > 3 MB")


@pytest.mark.parametrize("rel", CHAPTER_PAGES)
def test_no_exercise_answer_is_readable_without_a_click(fresh_page, rel):
    """The code that builds an exercise holds its answer (``answer=``,
    ``solution=``): on a freshly loaded page no such source may be
    visible; it may sit behind a collapsed toggle."""
    page = fresh_page(rel)
    sources = page.locator("div.cell_input", has_text="Exercise(")
    assert sources.count() > 0, "no exercise cell found: selector stale?"
    for i in range(sources.count()):
        src = sources.nth(i)
        code = src.locator("pre")
        visible = code.count() and code.first.is_visible()
        assert not visible, (
            f"exercise source visible without a click: "
            f"{src.inner_text()[:120]!r}")


# -- the two languages --------------------------------------------------------
def counterpart(rel: str) -> str:
    """The same page in the other language."""
    zh = PREFIX["zh"]
    return rel[len(zh):] if rel.startswith(zh) else zh + rel


@pytest.mark.parametrize("rel", PAGES)
def test_language_switch_leads_to_the_same_page(fresh_page, rel):
    page = fresh_page(rel)
    lang = language_of(rel)
    assert page.evaluate("() => document.documentElement.lang") == \
        {"en": "en", "zh": "zh-CN"}[lang]
    switch = page.locator("a.ti-language-switch")
    assert switch.count() == 1, "no language switch on the page"
    assert switch.is_visible()
    target = switch.evaluate("(a) => new URL(a.href).pathname")
    assert target == "/" + counterpart(rel), target
    assert (SITE / counterpart(rel)).exists()
    assert switch.inner_text() == {"en": "中文", "zh": "English"}[lang]


def test_switching_language_and_back(site, page):
    rel = f"book/{CHAPTERS[2]}.html"
    page.goto(f"{site.url}/{rel}")
    page.locator("a.ti-language-switch").click()
    page.wait_for_url(f"{site.url}/zh/{rel}")
    assert "练习" in page.locator("article").inner_text()
    page.locator("a.ti-language-switch").click()
    page.wait_for_url(f"{site.url}/{rel}")


@pytest.mark.parametrize("lang, query", [
    ("zh", "注意力"), ("zh", "键值缓存"), ("zh", "专家"),
    ("en", "attention")])
def test_search_finds_words(site, page, lang, query):
    """Sphinx's search for Chinese needs word segmentation (jieba) to
    index words, not single characters."""
    page.goto(f"{site.url}/{PREFIX[lang]}search.html?q={query}")
    hits = page.locator("#search-results ul.search li")
    hits.first.wait_for(timeout=20000)
    assert hits.count() >= 3, f"{query!r}: {hits.count()} pages found"


@pytest.mark.parametrize("lang, query, chapter", [
    ("en", "KV cache", "ch09_kv_cache"), ("zh", "键值缓存", "ch09_kv_cache"),
    ("en", "mixture of experts", "ch11_moe"), ("zh", "混合专家", "ch11_moe")])
def test_search_lists_the_chapter_named_by_the_query_first(
        site, page, lang, query, chapter):
    """Of the chapters a search lists, the first is the one whose title
    names the query (the glossary's entry may come before it): Sphinx's
    own ranking put chapters 10, 12 and 13 before chapter 9 for "KV
    cache" (book/_ext/search_scorer.js)."""
    page.goto(f"{site.url}/{PREFIX[lang]}search.html?q={query}")
    # Sphinx adds the results one by one, then writes the summary.
    page.wait_for_function("() => (document.querySelector("
                           "'#search-results .search-summary') || {})"
                           ".textContent", timeout=20000)
    hrefs = page.locator("#search-results ul.search li > a").evaluate_all(
        "(links) => links.map((a) => a.getAttribute('href'))")
    chapters = [m.group(0) for h in hrefs
                if (m := re.search(r"ch\d\d_[a-z0-9_]+", h))]
    assert chapters and chapters[0] == chapter, (
        f"{query!r}: chapters in the order listed: {chapters[:5]}")
