"""Explorer frames a reader can read: on a 1280 px screen the
text of every frame (tick labels, legends, titles, annotations) shows at
least at the body-text size of the page, and on a 390 px phone the frame
fits the width and its text shows at least ``PHONE_MIN_PX`` CSS px.

The size of a frame's smallest text is written by ``Explorer.static_html``
into ``data-font-px``, in pixels of the image's natural size (measured on
the drawn matplotlib figures, not assumed), so the text shows at
``font_px * displayed width / natural width`` CSS px. A frame without it
was rendered before this check existed, by matplotlib at its default
10 pt and 72 dpi: 10 px of natural size at most. ``data-clipped-text``
lists texts of any frame that stick out of the canvas (cut off); it must
be empty.
"""
from __future__ import annotations

import pytest

from test_pages import CHAPTER_PAGES

pytestmark = pytest.mark.browser

PHONE_MIN_PX = 11          # course_lib.notebook.widgets.PHONE_MIN_PX
OLD_FONT_PX = 10.0         # frames without data-font-px (see above)

FRAMES_JS = """() => ({
    body: parseFloat(getComputedStyle(
        document.querySelector('article p')).fontSize),
    inner: window.innerWidth,
    frames: Array.from(document.querySelectorAll('img.ti-frame')).map(i => ({
        key: i.closest('.ti-explorer').id,
        shown: i.getBoundingClientRect().width,
        right: i.getBoundingClientRect().right,
        natural: i.naturalWidth,
        font: i.dataset.fontPx === undefined ? null
              : parseFloat(i.dataset.fontPx),
        clipped: i.dataset.clippedText === undefined ? null
                 : JSON.parse(i.dataset.clippedText)}))})"""


def frames_of(page) -> dict:
    """The frames of a loaded page (read only: waits for their images)."""
    page.wait_for_function("""() => Array.from(document.querySelectorAll(
        'img.ti-frame')).every(i => i.complete && i.naturalWidth > 0)""")
    return page.evaluate(FRAMES_JS)


def frames_or_skip(page) -> dict:
    """:func:`frames_of` a page; the test is skipped where it has none."""
    found = frames_of(page)
    if not found["frames"]:
        pytest.skip("no explorer on this page")
    return found


def shown_px(frame: dict) -> float:
    font = OLD_FONT_PX if frame["font"] is None else frame["font"]
    return font * frame["shown"] / frame["natural"]


@pytest.mark.parametrize("rel", CHAPTER_PAGES)
def test_explorer_text_reads_at_body_size(fresh_page, rel):
    desktop = frames_or_skip(fresh_page(rel))       # 1280 x 900
    problems = []
    for f in desktop["frames"]:
        if f["clipped"]:
            problems.append(f"{f['key']}: text cut off at the frame's edge: "
                            f"{f['clipped']}")
        if shown_px(f) < desktop["body"] - 0.05:
            problems.append(
                f"1280 px: {f['key']} text {shown_px(f):.1f} px < body "
                f"{desktop['body']:.1f} px (frame {f['natural']} px shown "
                f"at {f['shown']:.0f} px)")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("rel", CHAPTER_PAGES)
def test_explorer_frames_fit_and_read_on_a_phone(fresh_phone, rel):
    phone = frames_or_skip(fresh_phone(rel))        # 390 x 844
    problems = []
    for f in phone["frames"]:
        if f["right"] > phone["inner"] + 0.5:
            problems.append(f"390 px: {f['key']} overflows: right edge at "
                            f"{f['right']:.0f} px")
        if shown_px(f) < PHONE_MIN_PX - 0.05:
            problems.append(
                f"390 px: {f['key']} text {shown_px(f):.1f} px < "
                f"{PHONE_MIN_PX} px (frame {f['natural']} px shown at "
                f"{f['shown']:.0f} px)")
    assert not problems, "\n".join(problems)
