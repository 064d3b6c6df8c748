"""The phone checks see what a phone shows.

``fresh_phone`` does not load a page at 390 px: it narrows the window of
the page's shared desktop load (``conftest.py``), which saves a load of
every page. That stands for a load at 390 px only if the page lays
itself out from its width alone, which holds while the theme and the
course's scripts size nothing once at load time. This test checks it on
a chapter with explorers and exercises in each language (every page
has the theme's header and drawers): every element's box, the page's
width and height are the same (within a pixel) as in a page loaded at
390 px. Boxes wholly off screen to the side (the theme's closed drawers)
are left out: nobody sees them.
"""
from __future__ import annotations

import pytest

from conftest import VIEWPORTS, open_page, resize

pytestmark = pytest.mark.browser

SAMPLE = ["book/ch05_multi_head_attention.html", "zh/book/ch11_moe.html"]

LAYOUT_JS = """() => {
    window.scrollTo(0, 0);
    const w = window.innerWidth;
    return {width: document.documentElement.scrollWidth,
            height: document.documentElement.scrollHeight,
            boxes: Array.from(document.querySelectorAll('body *')).map(
                (el, i) => { const r = el.getBoundingClientRect();
                return [i, el.tagName, r.left, r.top, r.width, r.height]; })
                .filter(b => b[2] + b[4] > 0 && b[2] < w)};
}"""


def layout(page) -> dict:
    resize(page, "phone")          # settle: scrolled to the top, drawn
    return page.evaluate(LAYOUT_JS)


@pytest.mark.parametrize("rel", SAMPLE)
def test_narrowed_page_lays_out_as_a_page_loaded_at_390_px(
        browser, site, fresh_phone, rel):
    narrowed = layout(fresh_phone(rel))
    context = browser.new_context(viewport=VIEWPORTS["phone"])
    try:
        page = context.new_page()
        open_page(page, f"{site.url}/{rel}")
        loaded = layout(page)
    finally:
        context.close()
    assert (narrowed["width"], narrowed["height"]) == (
        loaded["width"], loaded["height"])
    boxes = {b[0]: b for b in loaded["boxes"]}
    moved = [(b, boxes.get(b[0])) for b in narrowed["boxes"]
             if b[0] not in boxes or max(
                 abs(x - y) for x, y in zip(b[2:], boxes[b[0]][2:])) > 1]
    moved += [(None, b) for i, b in boxes.items()
              if i not in {n[0] for n in narrowed["boxes"]}]
    assert not moved, (f"{len(moved)} boxes differ (narrowed, loaded at "
                       f"390 px), e.g. {moved[:3]}")
