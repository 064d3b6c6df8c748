"""Small fixes to the HTML the theme stack emits, found by the browser tests.

- sphinx-thebe 0.3.1 under Sphinx 7.4 registers its inline configuration
  script twice, so every page threw "Identifier 'THEBE_JS_URL' has already
  been declared". Each page's script list is de-duplicated here.
"""
from sphinx.application import Sphinx


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


def setup(app: Sphinx) -> dict:
    app.connect("html-page-context", _dedupe_scripts)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
