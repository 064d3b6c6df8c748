"""The widgets as a reader uses them: rendered text, keyboard, phone, dark
mode and an accessibility scan, in the HTML book.

Each test loads pages of the built book in headless Chromium:

- exercise prompts, options, hints and the feedback shown after a Check
  hold no raw TeX (``$x$``, ``\\(``) or Markdown (``*word*``), and keep
  a 4.5:1 contrast in dark mode (one pass of clicks for both);
- Enter in an answer field checks it; every input and radio group has an
  accessible name that names its exercise; radio names are unique per
  exercise;
- formulas are not Tab stops; Tab alone reaches every widget control,
  the arrow keys drive a slider, every slider announces its value
  (``aria-valuetext``) and Enter checks an answer (on every English
  chapter and a Chinese one: the walk follows the structure the two
  editions share);
- at 390 px no page scrolls sideways and explorer frames fit the width;
- axe-core finds no violation in the course's own content, and only the
  listed theme violations (``THEME_VIOLATIONS``) outside it (colour
  contrast, a matter of the shared stylesheet, on the English pages).
"""
from __future__ import annotations

import json
import re

import pytest

from conftest import ROOT, open_page, settle_math
from test_pages import CHAPTER_PAGES, PAGES, language_of

pytestmark = pytest.mark.browser

# Words of the feedback the tests look for, per language (course_lib's
# messages, locale/zh/ui.json).
WORDS = {"en": {"correct": "Correct", "pick": "Pick an option"},
         "zh": {"correct": "正确", "pick": "请先选择"}}
AXE = ROOT / "_build" / "vendor" / "node_modules" / "axe-core" / "axe.min.js"

# Raw TeX delimiters, $...$ pairs and Markdown emphasis left as typed.
RAW_MARKUP = re.compile(
    r"\$[^$\s][^$]*\$|\\\(|\\\)|\\\[|\\\]|\*\*"
    r"|(?<![A-Za-z0-9_*])\*[^\s*][^*\n]*?(?<=[^\s*])\*(?![A-Za-z0-9_*])")

# The page text of an element as a reader sees it: typeset formulas,
# code and scripts left out.
VISIBLE_TEXT_JS = """(el) => {
    const w = document.createTreeWalker(el, NodeFilter.SHOW_TEXT);
    const out = [];
    while (w.nextNode()) {
        const n = w.currentNode;
        if (n.parentElement.closest(
            'mjx-container, code, pre, script, style, textarea')) continue;
        out.push(n.textContent);
    }
    return out.join('');
}"""

# The data an exercise's checker holds (answer, recognised mistakes).
EXERCISE_DATA_JS = """(root) => {
    const s = Array.from(root.querySelectorAll('script'))
        .map(x => x.textContent).find(t => t.includes(' d = {'));
    if (!s) return null;
    const line = s.split('\\n').find(l => l.includes(' d = {'));
    return line.slice(line.indexOf(' d = {') + 5, line.lastIndexOf(';'));
}"""


def raw_markup(page, locator) -> list[str]:
    text = locator.evaluate(VISIBLE_TEXT_JS)
    return [m.group(0) for m in RAW_MARKUP.finditer(text)]


def exercises(page, kind: str):
    """(key, locator) of each checkable exercise of one kind on the page."""
    sel = {"numeric": ".ti-exercise:has(input.ti-answer)",
           "choice": ".ti-exercise:has(input[type=radio])"}[kind]
    roots = page.locator(sel)
    return [(roots.nth(i).get_attribute("id")[len("ti-ex-"):], roots.nth(i))
            for i in range(roots.count())]


def exercise_data(root) -> dict:
    data = root.evaluate(EXERCISE_DATA_JS)
    assert data, "no checker data found in the exercise's script"
    return json.loads(data)


def check_and_read(page, root) -> str:
    root.locator(".ti-check").click()
    settle_math(page)
    out = root.locator(".ti-feedback")
    assert out.text_content().strip(), "Check gave no feedback"
    return out


# -- 1. Enter, labels, radio groups -------------------------------------------
def accessible_name(locator) -> str:
    return locator.evaluate("""(el) => {
        const by = el.getAttribute('aria-labelledby');
        if (by) return by.split(/\\s+/).map(id =>
            (document.getElementById(id) || {}).textContent || '').join(' ');
        if (el.getAttribute('aria-label')) return el.getAttribute('aria-label');
        if (el.labels && el.labels.length) return el.labels[0].textContent;
        const fs = el.closest('fieldset');
        const legend = fs && fs.querySelector('legend');
        return legend ? legend.textContent : '';
    }""").strip()


@pytest.mark.parametrize("rel", CHAPTER_PAGES)
def test_enter_checks_and_every_input_names_its_exercise(used_page, rel):
    page = used_page(rel)
    names = []
    for key, root in exercises(page, "numeric"):
        field = root.locator(".ti-answer")
        name = accessible_name(field)
        assert key in name, f"{key}: answer field named {name!r}"
        names.append(name)
        field.fill("")                      # another test may have typed
        field.focus()
        page.keyboard.type(repr(exercise_data(root)["answer"]))
        page.keyboard.press("Enter")
        out = root.locator(".ti-feedback").text_content()
        assert WORDS[language_of(rel)]["correct"] in out, (
            f"{key}: Enter in the field gave {out!r}")
    for key, root in exercises(page, "choice"):
        group = root.locator("[role=radiogroup], fieldset")
        assert group.count() == 1, f"{key}: options are not a named group"
        name = group.first.evaluate("""(g) => g.getAttribute('aria-label') ||
            (g.querySelector('legend') || {}).textContent || ''""")
        assert key in name, f"{key}: radio group named {name!r}"
        names.append(name)
        radios = root.locator("input[type=radio]")
        radio_names = {radios.nth(j).get_attribute("name")
                       for j in range(radios.count())}
        assert len(radio_names) == 1 and None not in radio_names, (
            f"{key}: radios are not one named group: {radio_names}")
        names.append(f"radio name {radio_names.pop()}")
        radios.first.focus()
        page.keyboard.press("Space")
        page.keyboard.press("Enter")
        out = root.locator(".ti-feedback").text_content()
        assert out.strip() and WORDS[language_of(rel)]["pick"] not in out, (
            f"{key}: Enter on a chosen option gave {out!r}")
    assert names, "no exercise with an input on the page"
    assert len(names) == len(set(names)), f"names repeat: {names}"


# -- 2. keyboard: formulas, sliders, Tab alone --------------------------------
@pytest.mark.parametrize("rel", [p for p in PAGES if "book/" in p])
def test_formulas_are_not_tab_stops(fresh_page, rel):
    page = fresh_page(rel)
    # Only a formula too wide for the column, which must scroll, may be a
    # stop (course.js marks it); every other one must not be.
    stops = page.evaluate("""() => Array.from(document.querySelectorAll(
        'mjx-container')).filter(m => m.tabIndex >= 0 &&
        !(m.scrollWidth > m.clientWidth)).length""")
    total = page.locator("mjx-container").count()
    assert stops == 0, f"{stops} of {total} formulas are Tab stops"


TAB_LIMIT = 800
TAB_BATCH = 20        # Tab presses between reads of the focus log

# The Tab walk follows the page's structure, which the two editions share
# (scripts/build_zh.py keeps every code cell and widget, the maths of
# every text is the English one: tests/test_zh_edition.py,
# zh_translations.py check); it runs on every English chapter and on the
# Chinese chapter with the most sliders, and the Chinese widgets' names
# and read-outs are checked on every page by the other tests here.
TAB_PAGES = [p for p in CHAPTER_PAGES if language_of(p) == "en"] + [
    "zh/book/ch02_positional_encoding.html"]


@pytest.mark.parametrize("rel", TAB_PAGES)
def test_keyboard_alone_uses_every_explorer_and_exercise(used_page, rel):
    """Tab from the top of the page reaches every slider, answer field,
    option group and Check button, and never stops on a formula; the
    arrow keys change a slider's frame, every slider announces the value
    it shows (``aria-valuetext``) and Enter checks an answer."""
    page = used_page(rel)
    wanted = page.evaluate("""() => {
        const ids = [];
        document.querySelectorAll('.ti-explorer input[type=range], '
            + '.ti-exercise .ti-answer, .ti-exercise .ti-check, '
            + '.ti-exercise input[type=radio]').forEach((el, i) => {
            el.dataset.kbd = 'w' + i;
            // one radio of a group is a stop (the checked or the first)
            if (el.type === 'radio' && el.value !== '0') return;
            ids.push('w' + i);
        });
        return ids;
    }""")
    # Every focus stop is logged by a focusin listener as it happens (the
    # focused element's mark, and whether it is a formula stop), so the
    # Tab presses need no round trip each to read document.activeElement.
    # A formula wider than the column scrolls, and Chromium lets the
    # keyboard focus a scroller (so it can be scrolled): that stop is
    # wanted. Any other stop on a formula is MathJax's menu stop.
    page.evaluate("""() => { window.__tabStops = [];
        document.addEventListener('focusin', (e) => { const a = e.target;
            const m = a.closest ? a.closest('mjx-container') : null;
            window.__tabStops.push([a.dataset ? a.dataset.kbd || '' : '',
                !!m && !(a === m && m.scrollWidth > m.clientWidth)]); },
            true); }""")
    seen, formula_stops, done, read = set(), 0, False, 0
    # Start from the top, wherever earlier tests of this page left the
    # focus: focusing <body> moves the point the next Tab starts from.
    page.evaluate("""() => { window.scrollTo(0, 0);
        const b = document.body; b.setAttribute('tabindex', '-1');
        b.focus(); b.removeAttribute('tabindex');
        window.__tabStops = []; }""")
    for presses in range(1, TAB_LIMIT + 1):
        page.keyboard.press("Tab")
        if presses % TAB_BATCH and presses < TAB_LIMIT:
            continue
        stops = page.evaluate("() => window.__tabStops")
        # Stops in order, up to the one that completes the set: the same
        # prefix the loop reading activeElement after each press saw.
        for kbd, on_formula in stops[read:]:
            seen.add(kbd)
            formula_stops += on_formula
            if set(wanted) <= seen:
                done = True
                break
        read = len(stops)
        if done:
            break
    missing = [w for w in wanted if w not in seen]
    assert not missing, f"{len(missing)} widget controls not reached by Tab"
    assert formula_stops == 0, f"Tab stopped on {formula_stops} formulas"
    # drive one explorer with arrows and one exercise with Enter
    slider = page.locator(".ti-explorer input[type=range]:not([max='0'])")
    if slider.count():
        s = slider.first
        img = page.locator(".ti-explorer img.ti-frame").first
        s.focus()
        page.keyboard.press("Home")
        before = img.get_attribute("src")
        page.keyboard.press("ArrowRight")
        assert img.get_attribute("src") != before, "ArrowRight: same frame"
    # every slider announces the value it shows, at both ends
    # (aria-valuetext, read by a screen reader, against its <output>)
    sliders = page.locator(".ti-explorer input[type=range]")
    for i in range(sliders.count()):
        s = sliders.nth(i)
        shown = s.locator("xpath=following-sibling::output[1]")
        for key in ([] if s.get_attribute("max") == "0" else
                    ["End", "Home"]):
            s.focus()
            page.keyboard.press(key)
            said = s.get_attribute("aria-valuetext")
            assert said == shown.text_content(), (
                f"slider {s.get_attribute('aria-label')!r} announces "
                f"{said!r}, shows {shown.text_content()!r} after {key}")
    ex = exercises(page, "numeric") or exercises(page, "choice")
    key, root = ex[0]
    if root.locator(".ti-answer").count():
        root.locator(".ti-answer").focus()
        page.keyboard.type("not a number")
    else:
        root.locator("input[type=radio]").first.focus()
        page.keyboard.press("Space")
    page.keyboard.press("Enter")
    assert root.locator(".ti-feedback").text_content().strip(), (
        f"{key}: Enter gave no feedback")


# -- 3. phone width -----------------------------------------------------------
@pytest.mark.parametrize("rel", PAGES)
def test_no_sideways_scrolling_at_390_px(fresh_phone, rel):
    phone = fresh_phone(rel)                 # 390 x 844, read only
    width = phone.evaluate("() => document.documentElement.scrollWidth")
    inner = phone.evaluate("() => window.innerWidth")
    wide = phone.evaluate("""() => Array.from(document.querySelectorAll(
        'article *')).filter(el => el.getBoundingClientRect().right >
        window.innerWidth + 1 && !el.closest('[class*=overflow], pre, '
        + '.highlight, .output, .cell_output, table, mjx-container, '
        + '.math, .MathJax, .table-wrapper, .pst-scrollable-table-container'))
        .slice(0, 3).map(el => el.tagName + '.' + el.className)""")
    assert width <= inner, (f"page is {width} px wide in a {inner} px "
                            f"window; too wide: {wide}")
    frames = phone.evaluate("""() => Array.from(document.querySelectorAll(
        'img.ti-frame')).map(i => i.getBoundingClientRect().right)""")
    assert all(r <= inner for r in frames), f"frames overflow: {frames}"


# -- 4. rendered text, and its contrast in dark mode --------------------------
CONTRAST_JS = """(el) => {
    function rgb(c) { const m = c.match(/[\\d.]+/g).map(Number);
        return {r: m[0], g: m[1], b: m[2], a: m.length > 3 ? m[3] : 1}; }
    function lum(c) { return [c.r, c.g, c.b].map(v => { v /= 255;
        return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4);
        }).reduce((s, v, i) => s + v * [0.2126, 0.7152, 0.0722][i], 0); }
    let bg = null;
    for (let n = el; n; n = n.parentElement) {
        const c = rgb(getComputedStyle(n).backgroundColor);
        if (c.a > 0.5) { bg = c; break; }
    }
    bg = bg || {r: 255, g: 255, b: 255};
    const fg = rgb(getComputedStyle(el).color);
    const [a, b] = [lum(fg), lum(bg)].sort((x, y) => y - x);
    return [(a + 0.05) / (b + 0.05), getComputedStyle(el).color,
            'rgb(' + [bg.r, bg.g, bg.b] + ')'];
}"""


@pytest.fixture()
def dark(used_page):
    """``dark(rel)``: the shared page of ``rel`` with the reader's system
    set to dark (the theme follows ``prefers-color-scheme`` as it
    changes); set back to light afterwards."""
    pages = []

    def open_dark(rel):
        page = used_page(rel)
        pages.append(page)
        page.emulate_media(color_scheme="dark")
        page.wait_for_function(
            "() => document.documentElement.dataset.theme === 'dark'")
        return page

    yield open_dark
    for page in pages:
        page.emulate_media(color_scheme="light")


@pytest.mark.parametrize("rel", CHAPTER_PAGES)
def test_exercise_text_and_feedback_are_rendered_and_readable_in_dark_mode(
        dark, rel):
    """Prompts, options, hints and solutions, and the feedback to every
    option and to every answer the checker knows (the right one, each
    recognised mistake, an absurd one), show no raw TeX or Markdown and
    keep a 4.5:1 contrast in dark mode. One pass of clicks serves both
    checks: the text a Check typesets does not depend on the colour
    scheme."""
    page = dark(rel)
    assert page.evaluate(
        "() => document.documentElement.dataset.theme") == "dark"
    found, low = [], []

    def measure(key, what, locator):
        ratio, fg, bg = locator.evaluate(CONTRAST_JS)
        if ratio < 4.5:
            low.append(f"{key} {what}: {ratio:.2f} ({fg} on {bg})")

    def check(key, what, root):
        out = check_and_read(page, root)
        found.extend((key, what, m) for m in raw_markup(page, out))
        measure(key, what, out)

    roots = page.locator(".ti-exercise")
    assert roots.count() > 0, "no exercise on the page"
    for i in range(roots.count()):
        root = roots.nth(i)
        # prompt, options, hint and solution (closed <details> included)
        found += [(root.get_attribute("id"), "text", m)
                  for m in raw_markup(page, root)]
    for key, root in exercises(page, "numeric"):
        measure(key, "prompt", root.locator(".ti-prompt"))
        measure(key, "answer field", root.locator(".ti-answer"))
        d = exercise_data(root)
        for value in ([repr(d["answer"])] + [repr(m[0]) for m in d["mistakes"]]
                      + ["1e300"]):
            root.locator(".ti-answer").fill(value)
            check(key, f"feedback for {value}", root)
    for key, root in exercises(page, "choice"):
        measure(key, "prompt", root.locator(".ti-prompt"))
        radios = root.locator("input[type=radio]")
        for j in range(radios.count()):
            measure(key, f"option {j}", root.locator(".ti-option").nth(j))
            radios.nth(j).check()
            check(key, f"feedback for option {j}", root)
    assert not found, "raw TeX/Markdown shown to the reader:\n" + "\n".join(
        f"  {k} ({where}): {m!r}" for k, where, m in found)
    assert not low, "below 4.5:1 in dark mode:\n" + "\n".join(low)


# -- 5. axe-core --------------------------------------------------------------
# Violations that come from the theme (pydata-sphinx-theme 0.17,
# sphinx-book-theme 1.3), outside the course's content, and that the book's
# configuration and book/_ext/html_fixes.py do not fix; benchmarks/results.md
# ("Accessibility") says why each remains. Any other rule, and any
# violation inside the article, fails the test.
THEME_VIOLATIONS = {
    "region": "theme header and sidebars outside landmarks",
}


def run_axe(page, contrast: bool = True) -> list[dict]:
    page.add_script_tag(path=str(AXE))
    return page.evaluate("""async (contrast) => {
        const r = await axe.run(document, {resultTypes: ['violations'],
            rules: {'color-contrast': {enabled: contrast}}});
        return r.violations.map(v => ({id: v.id, impact: v.impact,
            nodes: v.nodes.map(n => {
                const el = document.querySelector(n.target[0]);
                const inContent = !!(el && el.closest('article'));
                return {target: n.target.join(' '), content: inContent,
                        widget: !!(el && el.closest(
                            '.ti-exercise, .ti-explorer'))};
            })}));
    }""", contrast)


@pytest.mark.parametrize("rel", PAGES)
def test_axe_finds_nothing_in_the_course_content(fresh_page, rel):
    if not AXE.exists():
        pytest.skip("axe-core not vendored (run `make vendor`; needs npm)")
    page = fresh_page(rel)
    problems = []
    # colour contrast (a third of the scan's time) is a matter of the
    # stylesheet and the widgets' colours, which both editions share: it
    # is checked on the English pages (and in dark mode for both)
    for v in run_axe(page, contrast=language_of(rel) == "en"):
        for n in v["nodes"]:
            if n["content"] or v["id"] not in THEME_VIOLATIONS:
                where = "widget" if n["widget"] else (
                    "content" if n["content"] else "theme")
                problems.append(f"{v['id']} ({v['impact']}, {where}): "
                                f"{n['target']}")
    assert not problems, "\n".join(problems)


# -- 6. page weight -----------------------------------------------------------
def test_no_page_loads_the_fontawesome_script(site, page):
    requested = []
    page.on("request", lambda r: requested.append(r.url))
    open_page(page, f"{site.url}/{CHAPTER_PAGES[0]}")
    assert not [u for u in requested if "fontawesome.js" in u], requested
    icon = page.locator(".fa-magnifying-glass").first
    font, content = icon.evaluate("""(el) => {
        const s = getComputedStyle(el, '::before');
        return [s.fontFamily, s.content]; }""")
    assert "Font Awesome" in font and content not in ("none", "normal", ""), (
        font, content)
