"""Fixtures for the browser tests: a local HTTP server and system Chromium.

The tests drive the Debian ``chromium`` package through Playwright
(``executable_path``); nothing is downloaded. Without Chromium they are
skipped with the reason, and the rest of the suite still runs.
"""
from __future__ import annotations

import functools
import http.server
import os
import re
import shutil
import threading
from pathlib import Path

import pytest

from audit import watch

ROOT = Path(__file__).resolve().parents[2]
SITE = Path(os.environ.get("BOOK_HTML", ROOT / "_build" / "html"))
SCREENSHOTS = ROOT / "_build" / "screenshots"


def chromium_path() -> str | None:
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    return None


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):  # keep pytest output readable
        pass


class Server:
    """Serve a directory on 127.0.0.1 (random free port) in a thread."""

    def __init__(self, directory: Path):
        handler = functools.partial(_Quiet, directory=str(directory))
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0),
                                                     handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_port}"
        self.thread = threading.Thread(target=self.httpd.serve_forever,
                                       daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture(scope="session")
def browser():
    path = chromium_path()
    if path is None:
        pytest.skip("Chromium not installed (Debian package `chromium`); "
                    "browser tests skipped")
    from playwright.sync_api import sync_playwright

    from audit import CHROMIUM_ARGS
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=path, args=CHROMIUM_ARGS)
        yield b
        b.close()


def new_page(browser, **context_options):
    """A page in a fresh browser context (viewport, colour scheme...);
    use as ``yield from new_page(...)`` in a fixture."""
    context = browser.new_context(**context_options)
    yield context.new_page()
    context.close()


def open_page(page, url: str) -> None:
    page.goto(url, wait_until="load")
    settle_math(page)


# The page's own typesets are recorded as they start: the exercises
# typeset their feedback when it is shown (course_lib.notebook.exercises's
# show()), which MathJax finishes at once unless it must first load a
# piece of itself. settle_math waits for all of them, no longer.
SETTLE_MATH_JS = """() => {
    const mj = window.MathJax;
    if (!(mj && mj.startup && mj.startup.promise)) return true;
    return mj.startup.promise.then(() => {
        if (mj.typesetPromise && !mj.tiPending) {
            const typeset = mj.typesetPromise;
            mj.tiPending = [];
            mj.typesetPromise = function (...args) {
                const done = typeset.apply(this, args);
                mj.tiPending.push(done.catch(() => null));
                return done;
            };
        }
        return Promise.all(mj.tiPending || []);
    }).then(() => true);
}"""


def settle_math(page) -> None:
    """Wait until MathJax (if the page has it) has typeset everything: the
    page at load, and every typeset the page started since."""
    page.evaluate(SETTLE_MATH_JS)


@pytest.fixture()
def page(browser):
    yield from new_page(browser, viewport={"width": 1280, "height": 900})


@pytest.fixture(scope="session")
def site():
    if not (SITE / "index.html").exists():
        pytest.fail(f"no built book at {SITE}: run `make book` first")
    with Server(SITE) as server:
        yield server


# -- one load of a page, shared by the tests of that page --------------------
# Most tests are parametrized by a page of the book (``rel``, or a
# ``chapter`` name). Loading a chapter costs its renderer about two
# seconds of CPU (more on a busy machine), so the tests of one page share
# one load of it:
#
# - ``fresh_page(rel)`` (1280 x 900): the page exactly as loaded, for
#   checks that only read it (Colab links, hidden exercise source,
#   formulas as Tab stops, the axe-core scan, explorer text);
# - ``fresh_phone(rel)`` (390 x 844): the same load, its window narrowed
#   to a phone's width, for checks that only read it (sideways scrolling,
#   explorer frames). The page then lays out as a load at 390 px does:
#   ``test_phone.py`` compares every element's box of both on some pages;
# - ``audited_page(rel)``: the same load, back at 1280 x 900, with what
#   went wrong while it loaded, for the audit;
# - ``used_page(rel)`` (1280 x 900): the same load, for checks that type,
#   click and press keys (rendered feedback, Enter, the Tab walk, dark
#   mode). Such a test may find the page after another one of them, so it
#   must not depend on the state they leave (it clears a field before
#   typing, starts its Tab walk from the top, restores the colour scheme
#   it sets).
#
# A check that needs the page as loaded never sees it otherwise: once it
# has been narrowed, the next ``fresh_page`` loads it again; once it has
# been used, the next ``fresh_page``, ``fresh_phone`` or audit too.
# ``pytest_collection_modifyitems`` puts a page's tests next to each
# other in that order (desktop read-only, phone, audit, the rest), and
# under pytest-xdist ``pytest_xdist_make_scheduler`` hands all the tests
# of one page to one worker, so the page is loaded once for all of them.
# (pytest-xdist's own ``--dist loadgroup`` has no effect under pytest 9:
# it renames ``item._nodeid``, which pytest 9 no longer reads. Its
# default ``load`` hands out runs of consecutive tests to whichever
# worker is free, and split 10 of the 36 pages between the two workers,
# which then both loaded them.)
SHARED_FIXTURES = ("fresh_page", "fresh_phone", "audited_page", "used_page")
VIEWPORTS = {"desktop": {"width": 1280, "height": 900},
             "phone": {"width": 390, "height": 844}}

# After a window changes size: every running animation and transition
# (the theme slides its drawers off screen at a phone's width) finished,
# and two frames drawn.
SETTLE_JS = """() => Promise.all(document.getAnimations()
        .filter(a => a.effect && isFinite(a.effect.getComputedTiming().endTime))
        .map(a => a.finished.catch(() => null)))
    .then(() => new Promise(r => requestAnimationFrame(
        () => requestAnimationFrame(() => r(true)))))"""


def resize(page, viewport: str) -> None:
    """Set the window of ``page`` to ``VIEWPORTS[viewport]`` and wait until
    the page has laid itself out again."""
    page.set_viewport_size(VIEWPORTS[viewport])
    page.evaluate(SETTLE_JS)


def page_of(item) -> str | None:
    """The site-relative page a browser test is parametrized by."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    if "rel" in params:
        return params["rel"]
    if "chapter" in params:
        return f"book/{params['chapter']}.html"
    return None


def pytest_collection_modifyitems(config, items):
    first: dict[str, int] = {}
    keys = []
    for i, item in enumerate(items):
        fixtures = getattr(item, "fixturenames", ())
        shared = [f for f in SHARED_FIXTURES if f in fixtures]
        rel = page_of(item) if shared else None
        if rel is None:
            keys.append((i, 0, i))
            continue
        first.setdefault(rel, i)
        # the order of SHARED_FIXTURES: read-only checks of the page as
        # loaded, then at a phone's width, then the audit (it clicks, but
        # needs the page unused: it opens each <details> once), then the
        # checks that use the page
        kind = max(SHARED_FIXTURES.index(f) for f in shared)
        keys.append((first[rel], kind, i))
    order = sorted(range(len(items)), key=keys.__getitem__)
    items[:] = [items[i] for i in order]


# The page in a test id's parameters, e.g. ``test_x[zh/book/ch05.html]``.
PAGE_IN_ID = re.compile(r"\[([\w/.-]+\.html)\]$")


def pytest_xdist_make_scheduler(config, log):
    """Under pytest-xdist: give each worker whole pages (every test of one
    page), the largest groups first; the tests of no page go with the
    other such tests of their module (their module-scoped fixtures)."""
    from xdist.scheduler import LoadScopeScheduling

    class PageScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            found = PAGE_IN_ID.search(nodeid)
            return (found.group(1) if found
                    else super()._split_scope(nodeid))

    return PageScheduling(config, log)


class _PageCache:
    """The last page loaded, in its own context: its window size now, and
    whether it has been narrowed, audited or used since it loaded."""

    def __init__(self, browser):
        self.browser = browser
        self.entry: dict | None = None

    def get(self, url: str, viewport: str, opener, *, as_loaded=False,
            use=False, audit=False):
        e = self.entry
        if (e is None or e["url"] != url
                or (as_loaded and (e["resized"] or e["used"]))
                or (e["used"] and (audit or not use))):
            self.close()
            context = self.browser.new_context(viewport=VIEWPORTS["desktop"])
            page = context.new_page()
            # Record what goes wrong from the first request on, for the
            # audit, which then needs no load of its own.
            report, _ = watch(page, url)
            opener(page, url)
            e = self.entry = {
                "url": url, "context": context, "page": page,
                "report": report, "viewport": "desktop", "resized": False,
                "used": False, "audited": False}
        if e["viewport"] != viewport:
            resize(e["page"], viewport)
            e["viewport"] = viewport
            e["resized"] = True
        e["used"] |= use
        e["audited"] |= audit
        return (e["page"], e["report"]) if audit else e["page"]

    def close(self):
        if self.entry is not None:
            self.entry.pop("context").close()
            self.entry = None


@pytest.fixture(scope="session")
def _page_cache(browser):
    cache = _PageCache(browser)
    yield cache
    cache.close()


@pytest.fixture()
def fresh_page(_page_cache, site):
    """``fresh_page(rel)``: the page ``rel`` as loaded (``open_page``: load
    event, MathJax done) at 1280 x 900, shared by the read-only checks of
    that page. A test that uses it must not change the page."""
    return lambda rel: _page_cache.get(f"{site.url}/{rel}", "desktop",
                                       open_page, as_loaded=True)


@pytest.fixture()
def fresh_phone(_page_cache, site):
    """``fresh_phone(rel)``: the shared load of ``rel``, not used yet, its
    window set to 390 x 844 (a phone). A test that uses it must not change
    the page."""
    return lambda rel: _page_cache.get(f"{site.url}/{rel}", "phone",
                                       open_page)


@pytest.fixture()
def audited_page(_page_cache, site):
    """``audited_page(rel)``: ``(page, report)``, the shared load of
    ``rel``, not used yet, at 1280 x 900, and what :func:`audit.watch`
    recorded since it began (console errors, failed or off-site requests),
    for the audit's checks of the loaded page. The page counts as used
    afterwards."""
    return lambda rel: _page_cache.get(f"{site.url}/{rel}", "desktop",
                                       open_page, use=True, audit=True)


@pytest.fixture()
def used_page(_page_cache, site):
    """``used_page(rel)``: the page ``rel`` at 1280 x 900, loaded once for
    the tests of that page that interact with it (see above)."""
    return lambda rel: _page_cache.get(f"{site.url}/{rel}", "desktop",
                                       open_page, use=True)
