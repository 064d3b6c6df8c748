"""A link on every page to the same page in the book's other language.

The English book is built at ``_build/html/`` and the Chinese one under it
at ``_build/html/zh/``, with the same page names (``book/ch03_....html``).
After the build, each page gets, first among the header's buttons, a link
to its counterpart (``中文`` on English pages, ``English`` on Chinese
ones), written in the target language and marked with ``hreflang`` and
``lang``, and a ``<link rel="alternate" hreflang=...>`` in its head.

The book's language comes from ``ti_language`` ("en" or "zh") in the
book's ``_config.yml`` (``sphinx: config:``).
"""
from pathlib import Path

from sphinx.application import Sphinx

OTHER = {  # this book's language -> (other book's root, hreflang, label)
    "en": ("zh/", "zh-CN", "中文"),
    "zh": ("../", "en", "English"),
}
_BUTTONS = '<div class="article-header-buttons">'


def counterpart(page: Path, outdir: Path, language: str) -> str:
    """Relative URL of ``page``'s counterpart in the other language."""
    rel = page.relative_to(outdir)
    up = "../" * (len(rel.parts) - 1)
    return f"{up}{OTHER[language][0]}{rel.as_posix()}"


def add_switch(text: str, href: str, language: str) -> str:
    _, hreflang, label = OTHER[language]
    if _BUTTONS not in text or "ti-language-switch" in text:
        return text
    link = (f'<a href="{href}" class="btn btn-sm ti-language-switch" '
            f'hreflang="{hreflang}" lang="{hreflang}">{label}</a>')
    text = text.replace(_BUTTONS, f"{_BUTTONS}\n{link}", 1)
    alternate = (f'<link rel="alternate" hreflang="{hreflang}" '
                 f'href="{href}" />\n')
    return text.replace("</head>", alternate + "</head>", 1)


def _switch_pages(app: Sphinx, exception) -> None:
    if exception is not None or app.builder.format != "html":
        return
    language = app.config.ti_language
    if language not in OTHER:
        raise ValueError(f"ti_language must be one of {sorted(OTHER)}, got "
                         f"{language!r}")
    out = Path(app.outdir)
    for page in out.rglob("*.html"):
        if page.relative_to(out).parts[0].startswith("_"):
            continue                          # _static, _sources, ...
        text = page.read_text(encoding="utf-8")
        new = add_switch(text, counterpart(page, out, language), language)
        if new != text:
            page.write_text(new, encoding="utf-8")


def setup(app: Sphinx) -> dict:
    app.add_config_value("ti_language", "en", "html")
    app.connect("build-finished", _switch_pages)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
