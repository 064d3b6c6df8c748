"""Fixtures for the browser tests: a local HTTP server and system Chromium.

The tests drive the Debian ``chromium`` package through Playwright
(``executable_path``); nothing is downloaded. Without Chromium they are
skipped with the reason, and the rest of the suite still runs.
"""
from __future__ import annotations

import functools
import http.server
import os
import shutil
import threading
from pathlib import Path

import pytest

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


def settle_math(page) -> None:
    """Wait until MathJax (if the page has it) has typeset everything."""
    page.evaluate("""() => (window.MathJax && MathJax.startup &&
        MathJax.startup.promise) ? MathJax.startup.promise.then(() => true)
        : true""")
    page.wait_for_timeout(50)


@pytest.fixture()
def page(browser):
    yield from new_page(browser, viewport={"width": 1280, "height": 900})


@pytest.fixture(scope="session")
def site():
    if not (SITE / "index.html").exists():
        pytest.fail(f"no built book at {SITE}: run `make book` first")
    with Server(SITE) as server:
        yield server


# -- one page, loaded once, for the checks that only read it -----------------
# Most tests are parametrized by a page of the book (``rel``, or a
# ``chapter`` name). Each test that changes the page (clicks, typing, Tab,
# dark colour scheme) loads its own; the checks that only read a freshly
# loaded page share one load of it per viewport: ``fresh_page`` at
# 1280 x 900 (Colab links, hidden exercise source, formulas as Tab stops,
# the axe-core scan, explorer text on a desktop) and ``fresh_phone`` at
# 390 x 844 (sideways scrolling, explorer text on a phone).
# ``pytest_collection_modifyitems`` puts a page's read-only tests next to
# each other, so a worker that receives them together (pytest-xdist hands
# out runs of consecutive tests) loads that page once per viewport for
# all of them; at worst, one load per test, as before.
# (An xdist group would pin them to one worker, but pytest-xdist 3.8's
# ``--dist loadgroup`` has no effect under pytest 9: it renames
# ``item._nodeid``, which pytest 9 no longer reads.)
READ_ONLY_FIXTURES = ("fresh_page", "fresh_phone")
VIEWPORTS = {"desktop": {"width": 1280, "height": 900},
             "phone": {"width": 390, "height": 844}}


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
        read_only = any(f in fixtures for f in READ_ONLY_FIXTURES)
        rel = page_of(item) if read_only else None
        if rel is not None:
            first.setdefault(rel, i)
        keys.append((first[rel] if rel is not None else i, i))
    order = sorted(range(len(items)), key=keys.__getitem__)
    items[:] = [items[i] for i in order]


class _PageCache:
    """The last page loaded read-only, in its own context, per viewport."""

    def __init__(self, browser):
        self.browser = browser
        self.loaded: dict[str, tuple] = {}   # viewport -> (url, context, page)

    def get(self, url: str, viewport: str, opener):
        url_now, _, page = self.loaded.get(viewport, (None, None, None))
        if url != url_now:
            self.close(viewport)
            context = self.browser.new_context(viewport=VIEWPORTS[viewport])
            page = context.new_page()
            opener(page, url)
            self.loaded[viewport] = (url, context, page)
        return page

    def close(self, viewport: str | None = None):
        for vp in [viewport] if viewport else list(self.loaded):
            if vp in self.loaded:
                self.loaded.pop(vp)[1].close()


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
                                       open_page)


@pytest.fixture()
def fresh_phone(_page_cache, site):
    """``fresh_phone(rel)``: as ``fresh_page``, at 390 x 844 (a phone)."""
    return lambda rel: _page_cache.get(f"{site.url}/{rel}", "phone",
                                       open_page)
