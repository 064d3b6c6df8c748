"""What a reader would stumble over on one page, checked in a real browser.

:func:`audit_page` opens a page served on 127.0.0.1 in Chromium (driven by
Playwright) and returns a list of problems, each a short sentence (it is
:func:`watch` before the load and :func:`inspect` after it). The same
function audits the built book (``test_pages.py``) and small fixture sites
built to fail on purpose (``test_audit_fixture.py``), which shows that every
check can fail.

Checks: console errors and uncaught exceptions; failed or 4xx/5xx requests;
requests that leave the local server (the book must not need a CDN); images
that did not load; math that MathJax did not render; static explorers whose
sliders do not change the frame; solution dropdowns and hint/solution
``<details>`` that do not open; images without a real alt text or caption;
internal links (and their #fragments) that do not resolve.
"""
from __future__ import annotations

import functools
import re
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from urllib.parse import unquote, urldefrag, urlparse

CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu",
                 "--disable-background-networking",
                 "--disable-component-update", "--disable-sync",
                 "--no-first-run", "--disable-quic"]
FILENAME_ALT = re.compile(r"(^|/)[^/ ]+\.(png|jpe?g|svg|gif)$", re.I)
RAW_TEX = re.compile(r"\\\(|\\\)|\\\[|\\\]|\$\$")


@dataclass
class PageReport:
    url: str
    problems: list[str] = field(default_factory=list)
    external_requests: list[str] = field(default_factory=list)
    links: set[str] = field(default_factory=set)

    def add(self, problem: str) -> None:
        self.problems.append(problem)


def audit_page(page, url: str, *, screenshot: str | None = None,
               full_page: bool = False,
               check_links: bool = True) -> PageReport:
    """Load ``url`` in ``page`` (a Playwright Page) and audit it; with
    ``screenshot`` (a path), also save the first screen (``full_page``:
    the whole page) there."""
    report, stop = watch(page, url)
    try:
        page.goto(url, wait_until="load")
        inspect(page, report, screenshot=screenshot, full_page=full_page,
                check_links=check_links)
    finally:
        stop()
    return report


def watch(page, url: str):
    """Start recording what goes wrong on ``page`` before it loads ``url``:
    console errors, uncaught exceptions, failed and 4xx/5xx requests, and
    requests that leave the site (aborted: the page never reaches the
    network). Returns the report and a function that stops recording. The
    browser tests' page cache (conftest.py) watches every desktop load, so
    the audit can inspect a page other read-only checks already used."""
    report = PageReport(url)
    origin = "{0.scheme}://{0.netloc}".format(urlparse(url))

    def on_console(msg):
        if msg.type == "error":
            report.add(f"console error: {msg.text}")

    def on_page_error(exc):
        report.add(f"page error: {exc}")

    def on_request(request):
        if not request.url.startswith((origin, "data:", "blob:", "about:")):
            report.external_requests.append(request.url)
            report.add(f"request leaves the site: {request.url}")

    def on_failed(request):
        if request.url.startswith(origin):
            report.add(f"request failed: {request.url} "
                       f"({request.failure})")

    def on_response(response):
        if response.url.startswith(origin) and response.status >= 400:
            report.add(f"HTTP {response.status} for {response.url}")

    listeners = [("console", on_console), ("pageerror", on_page_error),
                 ("request", on_request), ("requestfailed", on_failed),
                 ("response", on_response)]
    for event, listener in listeners:
        page.on(event, listener)
    # Never let a page reach the network: anything not served locally is
    # recorded above as a problem and aborted here.
    page.route(lambda u: not u.startswith(origin), lambda r: r.abort())

    def stop():
        for event, listener in listeners:
            page.remove_listener(event, listener)
    return report, stop


def inspect(page, report: PageReport, *, screenshot: str | None = None,
            full_page: bool = False, check_links: bool = True) -> None:
    """The checks of a loaded page (its load watched by :func:`watch`)."""
    origin = "{0.scheme}://{0.netloc}".format(urlparse(report.url))
    _load_lazy_images(page)
    # Wait for images to settle (loaded or failed); not "networkidle",
    # which a busy machine can miss while nothing is actually pending.
    page.wait_for_function(
        "() => Array.from(document.images).every(i => i.complete)",
        timeout=20000)
    _wait_for_mathjax(page, report)
    _check_images(page, report)
    _check_math(page, report)
    _check_explorers(page, report)
    _check_dropdowns(page, report)
    if check_links:
        _check_links(page, report, origin)
    if screenshot:
        if not full_page:            # the first screen, as a reader
            page.evaluate("() => window.scrollTo(0, 0)")  # lands
        page.screenshot(path=screenshot, full_page=full_page)


def _load_lazy_images(page) -> None:
    page.evaluate("""() => document.querySelectorAll('img[loading="lazy"]')
        .forEach(img => { img.loading = 'eager'; })""")


def _wait_for_mathjax(page, report: PageReport) -> None:
    has_math = page.evaluate(
        "() => document.querySelector('.math') !== null")
    if not has_math:
        return
    # MathJax is loaded with `defer`, so after the load event it is there.
    if not page.evaluate("() => !!(window.MathJax && MathJax.startup)"):
        report.add("MathJax did not load, so math cannot render")
        return
    try:
        page.evaluate("() => MathJax.startup.promise.then(() => true)")
    except Exception as exc:
        report.add(f"MathJax failed while typesetting: {exc}")


def _check_images(page, report: PageReport) -> None:
    images = page.evaluate("""() => Array.from(document.images).map(img => ({
        src: img.currentSrc || img.src, ok: img.complete &&
        img.naturalWidth > 0, alt: (img.getAttribute('alt') || '').trim(),
        caption: !!(img.closest('figure') &&
                    img.closest('figure').querySelector('figcaption')),
        inArticle: !!img.closest('article'),
        decorative: img.getAttribute('role') === 'presentation'}))""")
    for img in images:
        src = img["src"] if not img["src"].startswith("data:") else \
            img["src"][:40] + "..."
        if not img["ok"]:
            report.add(f"image did not load: {src}")
        if img["inArticle"] and not img["decorative"] and not img["caption"]:
            if not img["alt"] or FILENAME_ALT.search(img["alt"]):
                report.add(f"image without alt text or caption: {src} "
                           f"(alt={img['alt']!r})")


def _check_math(page, report: PageReport) -> None:
    result = page.evaluate("""() => {
        const math = Array.from(document.querySelectorAll('.math'));
        const unrendered = math.filter(el => !el.querySelector(
            'mjx-container') && !el.closest('mjx-container'));
        const clone = document.querySelector('article') ||
                      document.body;
        const walker = document.createTreeWalker(clone,
            NodeFilter.SHOW_TEXT);
        const raw = [];
        while (walker.nextNode()) {
            const node = walker.currentNode;
            if (node.parentElement.closest(
                'pre, code, script, style, textarea, .highlight, mjx-container'))
                continue;
            raw.push(node.textContent);
        }
        return {total: math.length,
                unrendered: unrendered.slice(0, 3).map(el => el.textContent),
                count: unrendered.length, text: raw.join(' ')};
    }""")
    if result["count"]:
        report.add(f"{result['count']} of {result['total']} math elements "
                   f"not rendered, e.g. {result['unrendered']}")
    m = RAW_TEX.search(result["text"])
    if m:
        start = max(0, m.start() - 30)
        report.add("raw TeX left in the page text: "
                   f"{result['text'][start:m.end() + 30]!r}")


def _check_explorers(page, report: PageReport) -> None:
    explorers = page.locator(".ti-explorer")
    for i in range(explorers.count()):
        root = explorers.nth(i)
        name = root.get_attribute("id")
        img = root.locator("img.ti-frame")
        sliders = root.locator("input[type=range]")
        if sliders.count() == 0:
            report.add(f"explorer {name} has no slider")
        for j in range(sliders.count()):
            slider = sliders.nth(j)
            before = img.get_attribute("src")
            at_max = slider.input_value() == slider.get_attribute("max")
            if slider.get_attribute("max") == "0":
                continue               # a control with a single value
            slider.focus()
            page.keyboard.press("ArrowLeft" if at_max else "ArrowRight")
            if img.get_attribute("src") == before:
                report.add(f"explorer {name}: moving slider {j} did not "
                           "change the frame")
            page.keyboard.press("ArrowRight" if at_max else "ArrowLeft")


def _check_dropdowns(page, report: PageReport) -> None:
    # sphinx-exercise solutions with :class: dropdown (sphinx-togglebutton)
    toggles = page.locator(".solution.dropdown, .dropdown.admonition")
    for i in range(toggles.count()):
        box = toggles.nth(i)
        title = box.locator(".admonition-title").first
        content = box.locator("section, p:not(.admonition-title)").first
        if content.count() == 0:
            report.add(f"dropdown {i} has no content")
            continue
        if content.is_visible():
            report.add(f"dropdown {i} is open before it is clicked")
        title.click()
        try:
            content.wait_for(state="visible", timeout=3000)
        except Exception:
            report.add(f"dropdown {i} did not open when clicked "
                       f"({box.get_attribute('id')})")
    # <details> (hidden cell sources, widget hints and solutions): a click
    # event on each summary, dispatched in the page in one round trip.
    # Playwright's click on each would also scroll it into view and wait
    # for it to be still, which costs about 0.15 s of repainting a chapter
    # page per element (3.4 s for chapter 5's 22) and checks nothing more
    # about the toggle: the event and the browser's default action (open)
    # are the same, and a script that cancels it is caught.
    shut = page.evaluate("""() => Array.from(document.querySelectorAll(
        'article details')).map((d, i) => {
            const s = d.querySelector('summary');
            if (s) s.click();
            return d.open ? -1 : i; }).filter(i => i >= 0)""")
    for i in shut:
        report.add(f"<details> {i} did not open when clicked")


def _check_links(page, report: PageReport, origin: str) -> None:
    hrefs = page.evaluate("""() => Array.from(document.querySelectorAll(
        'a[href]')).map(a => a.href)""")
    for href in sorted(set(hrefs)):
        if not href.startswith(origin):
            continue
        target, fragment = urldefrag(href)
        fragment = unquote(fragment)         # e.g. #%E4%B8%8A is id="上"
        report.links.add(target)
        ids = _anchors(target)
        if ids is None:
            report.add(f"broken internal link: {href}")
        elif fragment and fragment not in ids:
            report.add(f"link to a missing anchor: {href}")


# Every page of the book links to the same few dozen pages (the sidebar),
# some of them megabytes of inlined figures: each target is fetched and
# scanned for its ids once per test process, not once per linking page.
# The served files do not change while the tests run; every link of every
# page is still checked against them.
_ID_RE = re.compile(r"""id=["']([^"']*)["']""")


@functools.lru_cache(maxsize=None)
def _anchors(url: str) -> frozenset[str] | None:
    """The ``id="..."`` values of the page at ``url`` (None: it failed)."""
    body = _fetch(url)
    return None if body is None else frozenset(_ID_RE.findall(body))


def _fetch(url: str) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            data = resp.read()
            kind = resp.headers.get("Content-Type", "")
    except (urllib.error.URLError, OSError):
        return None
    return data.decode("utf-8", "replace") if "html" in kind else ""


def colab_links(page) -> list[str]:
    """Every link on the page that opens a notebook in Colab."""
    return sorted(set(page.evaluate("""() => Array.from(
        document.querySelectorAll('a[href*="colab.research.google.com"]'))
        .map(a => a.href)""")))
