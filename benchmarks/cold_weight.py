"""Bytes a first visit to each page transfers, measured in Chromium.

``page_weight.py`` counts a page's HTML and images and the shared
``_static/`` folder once; a reader's first visit also pays for every
script, style sheet and font the page pulls in. Here each page is opened
in a fresh browser context (empty cache) from a local server, and the
bodies of all responses are summed, MathJax's fonts and lazy modules
included (the page is measured after MathJax has typeset it). The local
server does not compress, so these are uncompressed bytes; the largest
shared files are listed with their gzip size as well.

Usage: ``python benchmarks/cold_weight.py [SITE]`` (default
``_build/html``) prints a Markdown table; needs Chromium (Debian package
``chromium``) and Playwright, as the browser tests do.
"""
from __future__ import annotations

import gzip
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "browser"))


def measure(site: Path, pages: list[str]) -> tuple[dict, Counter]:
    """{page: (bytes, requests)} and bytes per shared resource."""
    from playwright.sync_api import sync_playwright

    from audit import CHROMIUM_ARGS
    from conftest import Server, chromium_path
    results, per_file = {}, Counter()
    with Server(site) as server, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium_path(),
                                    args=CHROMIUM_ARGS)
        for rel in pages:
            context = browser.new_context(
                viewport={"width": 1280, "height": 900})
            page = context.new_page()
            sizes: dict[str, int] = {}

            def on_finished(request, sizes=sizes):
                response = request.response()
                if response is None or not request.url.startswith(
                        server.url):
                    return
                try:
                    sizes[request.url] = len(response.body())
                except Exception:         # e.g. a redirect has no body
                    sizes[request.url] = 0

            page.on("requestfinished", on_finished)
            page.goto(f"{server.url}/{rel}", wait_until="load")
            page.evaluate("""() => (window.MathJax && MathJax.startup) ?
                MathJax.startup.promise.then(() => true) : true""")
            page.wait_for_timeout(500)     # fonts requested by the typeset
            results[rel] = (sum(sizes.values()), len(sizes))
            for url, n in sizes.items():
                if "/_static/" in url:
                    per_file[url.split("/_static/", 1)[1].split("?")[0]] = n
            context.close()
        browser.close()
    return results, per_file


def rows(site: Path = ROOT / "_build" / "html") -> list[str]:
    from test_pages import PAGES         # the pages the book is made of
    results, per_file = measure(site, PAGES)
    out = ["", "## Cold page weight (first visit, measured in Chromium)", "",
           "Every response a page's first visit transfers (empty cache, "
           "local server, no compression; after MathJax has typeset), "
           "measured by `benchmarks/cold_weight.py`.", "",
           "| page | requests | first visit (KB) |", "|---|---:|---:|"]
    for rel, (size, count) in results.items():
        out.append(f"| `{rel}` | {count} | {size / 1024:.0f} |")
    out += ["", "Largest shared files (raw / gzip -9, KB):", ""]
    for name, size in per_file.most_common(6):
        path = site / "_static" / name
        gz = len(gzip.compress(path.read_bytes(), 9)) if path.exists() else 0
        out.append(f"- `_static/{name}`: {size / 1024:.0f} / "
                   f"{gz / 1024:.0f}")
    return out


if __name__ == "__main__":
    site = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "_build" / \
        "html"
    print("\n".join(rows(site)))
