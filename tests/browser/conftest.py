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


@pytest.fixture()
def page(browser):
    yield from new_page(browser, viewport={"width": 1280, "height": 900})


@pytest.fixture(scope="session")
def site():
    if not (SITE / "index.html").exists():
        pytest.fail(f"no built book at {SITE}: run `make book` first")
    with Server(SITE) as server:
        yield server
