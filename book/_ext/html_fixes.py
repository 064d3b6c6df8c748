"""Small fixes to the HTML the theme stack emits, found by the browser tests.

- sphinx-thebe 0.3.1 under Sphinx 7.4 registers its inline configuration
  script twice, so every page threw "Identifier 'THEBE_JS_URL' has already
  been declared". Each page's script list is de-duplicated here.
- The book's own stylesheet for the course's explorers and exercises
  (``static/course.css``: feedback colours for light and dark mode, frames
  that fit the column) is added to every page.
- pydata-sphinx-theme loads ``scripts/fontawesome.js`` (1.49 MB, the
  whole Font Awesome icon set as JavaScript, "so that users can add custom
  icons") on every page. The theme's stylesheet already draws the icons it
  uses from the Font Awesome web fonts, and the book adds no custom icons,
  so the script is taken out of every page and the file out of the site.
- myst-nb names every "Show code cell source" toggle "Toggle hidden
  content" (``aria-label``), a name that does not contain its visible text
  (axe: label-content-name-mismatch). The toggle is rendered here without
  that label, so its visible text is its name.
- Two more name and role fixes on the built pages, found by axe-core:
  Sphinx marks each bibliography entry ``role="doc-biblioentry"`` (a
  deprecated role, not allowed on a ``div``) inside a ``role="list"``,
  which then has no list items: entries become ``role="listitem"``. The
  theme's search button is labelled "Search" while it shows "Search
  Ctrl+K" (搜索 in the Chinese edition): the label is dropped, so the
  visible text is its name.
- ``static/course.js``: a display formula wider than the column scrolls
  sideways; the script makes such a formula focusable (and only such a
  formula), so that the keyboard can scroll it (axe:
  scrollable-region-focusable). MathJax's own Tab stop on every formula is
  off (``inTabOrder: false`` in ``_config.yml``).
- Search ranking (``search_scorer.js``, Sphinx's ``html_search_scorer``):
  a page whose title holds every word of the query comes before pages
  that only have a section about it (Sphinx put "10. Multi-head latent
  attention" first for "KV cache", "9. The KV cache" fifth).
"""
import re
from pathlib import Path

from sphinx.application import Sphinx

STATIC = Path(__file__).resolve().parent / "static"
SCORER = STATIC.parent / "search_scorer.js"
# (pattern, replacement) applied to every built page; see the docstring.
PAGE_FIXES = [
    (re.compile(r'[ \t]*<script defer src="[^"]*_static/scripts/'
                r'fontawesome\.js[^"]*"></script>\n?'), ""),
    (re.compile(r'(<div class="citation" id="[^"]*" )role="doc-biblioentry"'),
     r'\1role="listitem"'),
    (re.compile(r'(<button class="btn search-button-field[^"]*" '
                r'title="[^"]*") aria-label="[^"]*"'), r"\1"),
]


def _dedupe_scripts(app: Sphinx, pagename, templatename, context,
                    doctree) -> None:
    scripts = context.get("script_files")
    if not scripts:
        return
    seen, unique = set(), []
    for script in scripts:
        # The duplicates differ only in filename None vs "" (no file).
        key = (str(getattr(script, "filename", script) or ""),
               tuple(sorted(getattr(script, "attributes", {}).items())))
        if key not in seen:
            seen.add(key)
            unique.append(script)
    context["script_files"] = unique


def _add_static(app: Sphinx, config) -> None:
    config.html_static_path.append(str(STATIC))
    config.html_search_scorer = str(SCORER)


def _fix_pages(app: Sphinx, exception) -> None:
    if exception is not None or app.builder.format != "html":
        return
    out = Path(app.outdir)
    for page in out.rglob("*.html"):
        text = new = page.read_text(encoding="utf-8")
        for pattern, replacement in PAGE_FIXES:
            new = pattern.sub(replacement, new)
        if new != text:
            page.write_text(new, encoding="utf-8")
    for path in (out / "_static" / "scripts").glob("fontawesome.js*"):
        path.unlink()


def _visit_hide_input(self, node) -> None:
    """myst-nb's visit_HideCellInput without the mismatching aria-label."""
    from html import escape
    classes = " ".join(node["classes"])
    self.body.append(f'<details class="admonition hide {classes}">\n'
                     '<summary>\n'
                     f'<p class="collapsed admonition-title">'
                     f'{escape(node["prompt_show"])}</p>\n'
                     f'<p class="expanded admonition-title">'
                     f'{escape(node["prompt_hide"])}</p>\n</summary>\n')


def _override_hide_input(app: Sphinx) -> None:
    from myst_nb.sphinx_ import HideCodeCellNode, depart_HideCellInput
    app.add_node(HideCodeCellNode, override=True,
                 html=(_visit_hide_input, depart_HideCellInput))


def setup(app: Sphinx) -> dict:
    app.connect("config-inited", _add_static)
    app.connect("builder-inited", _override_hide_input)
    app.add_css_file("course.css")
    app.add_js_file("course.js")
    app.connect("html-page-context", _dedupe_scripts)
    app.connect("build-finished", _fix_pages)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
