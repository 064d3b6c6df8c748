"""Tests of the browser tests: each check fails on a page built to fail.

A small fixture site is written to a temporary folder: one clean page and
one page per defect. The audit must pass the clean page (including a real
explorer and real exercises from course_lib) and must report each defect.
"""
from __future__ import annotations

import base64
import time

import pytest

from audit import audit_page
from conftest import Server
from course_lib.notebook.exercises import ChoiceExercise, NumericExercise
from course_lib.notebook.widgets import Explorer

pytestmark = pytest.mark.browser

PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIA"
    "X8jx0gAAAABJRU5ErkJggg==")


def _draw(fig, *, a):
    fig.add_subplot().plot([0, 1], [0, a])


def page_html(body: str, head: str = "") -> str:
    return (f"<!doctype html><html><head><meta charset='utf-8'>{head}"
            f"</head><body><article>{body}</article></body></html>")


DEFECTS = {
    "broken_image": ('<img src="missing.png" alt="A plot">',
                     "image did not load"),
    "raw_tex": ('<p><span class="math">\\(x^2\\)</span></p>',
                "MathJax did not load"),
    "raw_tex_text": ("<p>Where \\(x\\) is left raw.</p>",
                     "raw TeX left in the page text"),
    "dead_link": ('<a href="nowhere.html">gone</a>', "broken internal link"),
    "missing_anchor": ('<a href="clean.html#no-such-id">x</a>',
                       "link to a missing anchor"),
    "dead_explorer": (
        '<div class="ti-explorer" id="ti-explorer-dead">'
        '<input type="range" min="0" max="2" value="0">'
        '<img class="ti-frame" alt="frame" src="ok.png"></div>',
        "did not change the frame"),
    "filename_alt": ('<img src="ok.png" alt="../_images/ok.png">',
                     "image without alt text or caption"),
    "console_error": ("<script>console.error('boom')</script>",
                      "console error: boom"),
    "page_error": ("<script>undefinedFunction()</script>", "page error"),
    "cdn": ('<script src="https://cdn.example.invalid/lib.js"></script>',
            "request leaves the site"),
    "dropdown_open": (
        '<div class="solution dropdown admonition">'
        '<p class="admonition-title">Solution</p>'
        '<section><p>The answer.</p></section></div>',
        "is open before it is clicked"),
    "details_stuck": (
        '<details><summary onclick="event.preventDefault()">Hint</summary>'
        '<p>A hint.</p></details>', "did not open when clicked"),
}


@pytest.fixture(scope="module")
def fixture_site(tmp_path_factory):
    root = tmp_path_factory.mktemp("fixture-site")
    (root / "ok.png").write_bytes(PNG)
    explorer = Explorer(key="fx-line", title="Line", draw=_draw,
                        controls={"a": [1, 2, 3]}, figsize=(2, 1.5))
    numeric = NumericExercise(key="fx-num", purpose="application",
                              prompt="Half of one?",
                              answer=0.5, hint="Divide.", solution="0.5",
                              mistakes=[(2, "That is one over a half.")])
    prediction = NumericExercise(key="fx-pred", purpose="prediction",
                                 prompt="Predict the mean.", answer=3.25,
                                 rtol=0.1, hint="h", solution="s",
                                 mistakes=[(1, "That is the first value.")])
    choice = ChoiceExercise(key="fx-choice", purpose="application",
                            prompt="Pick b.",
                            options=["a", "b"], answer=1, hint="b",
                            solution="b", explanations=["No.", "Yes."])
    clean = ('<h1 id="top">Clean</h1><p><a href="#top">top</a></p>'
             '<figure><img src="ok.png" alt=""><figcaption>A dot.'
             '</figcaption></figure><img src="ok.png" alt="A dot">'
             + explorer.static_html() + numeric.static_html()
             + prediction.static_html() + choice.static_html())
    (root / "clean.html").write_text(page_html(clean))
    for name, (body, _) in DEFECTS.items():
        (root / f"{name}.html").write_text(page_html(body))
    with Server(root) as server:
        yield server


def test_clean_page_passes(fixture_site, page):
    report = audit_page(page, f"{fixture_site.url}/clean.html")
    assert report.problems == []


@pytest.mark.parametrize("name", sorted(DEFECTS))
def test_each_defect_is_reported(fixture_site, page, name):
    report = audit_page(page, f"{fixture_site.url}/{name}.html")
    needle = DEFECTS[name][1]
    assert any(needle in p for p in report.problems), report.problems


def test_static_exercises_check_answers_in_the_browser(fixture_site, page):
    page.goto(f"{fixture_site.url}/clean.html")
    num = page.locator("#ti-ex-fx-num")
    feedback = num.locator(".ti-feedback")
    for answer, expected in [("1/2", "Correct"), ("2", "one over a half"),
                             ("0.9", "too large"), ("abc", "type a number"),
                             ("0,5", "Correct: 0.5."),      # decimal comma
                             ("0x10", "type a number"),     # Python parity
                             # refused at once: 20,000 digits once made the
                             # pattern backtrack for seconds
                             ("1" * 20000 + "x", "type a number"),
                             ("1" * 101, "type a number"),
                             ("0." + "0" * 97 + "5", "too small")]:
        num.locator(".ti-answer").fill(answer)
        start = time.perf_counter()
        num.locator(".ti-check").click()
        assert expected in feedback.text_content(), (answer[:20],
                                                     feedback.text_content())
        assert time.perf_counter() - start < 2
    pred = page.locator("#ti-ex-fx-pred")
    assert pred.locator(".ti-prompt strong").text_content() == "Prediction."
    measured = "The experiment in the next cell measures 3.25."
    for answer, expected in [("3", "Correct: 3."), ("1", "first value"),
                             ("5", "too large"), ("x", "type a number")]:
        pred.locator(".ti-answer").fill(answer)
        pred.locator(".ti-check").click()
        text = pred.locator(".ti-feedback").text_content()
        assert expected in text and (measured in text) == (answer != "x"), (
            answer, text)
    ch = page.locator("#ti-ex-fx-choice")
    ch.locator(".ti-check").click()
    assert "Pick an option" in ch.locator(".ti-feedback").text_content()
    ch.locator("input[value='0']").check()
    ch.locator(".ti-check").click()
    assert "Not this one. No." in ch.locator(".ti-feedback").text_content()
    ch.locator("input[value='1']").check()
    ch.locator(".ti-check").click()
    assert "Correct. Yes." in ch.locator(".ti-feedback").text_content()


def test_static_explorer_shows_the_frame_for_each_value(fixture_site, page):
    page.goto(f"{fixture_site.url}/clean.html")
    root = page.locator("#ti-explorer-fx-line")
    frames = root.locator(".ti-frames").text_content()
    srcs = []
    slider = root.locator("input[type=range]")
    slider.focus()
    page.keyboard.press("Home")
    for _ in range(3):
        srcs.append(root.locator("img.ti-frame").get_attribute("src"))
        page.keyboard.press("ArrowRight")
    assert len(set(srcs)) == 3 and all(s in frames for s in srcs)
    assert root.locator("output").text_content() == "3"
