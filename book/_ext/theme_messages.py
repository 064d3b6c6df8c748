"""The theme's own words in the book's language, where its catalogue has none.

Sphinx, pydata-sphinx-theme and sphinx-book-theme translate their
interface (上一页, 下一页, 目录 ...) through gettext catalogues chosen by
``language``. For Chinese those catalogues leave some messages in English
(the sidebar toggles' names, "Launch interactive content", "Color mode",
"System Settings") or in traditional Chinese (sphinx-book-theme's zh_CN
catalogue says 列印成 PDF). The book's config names its own messages,

    ti_messages: {"Toggle primary sidebar": "切换主侧栏", ...}

(``sphinx: config:`` in ``zh/_config.yml``, written by
``scripts/build_zh.py``), and this extension puts them in front of every
catalogue that Sphinx and the themes read: a message found there is shown
as given, any other is looked up as before. The search box's text is a
theme option (``search_bar_text``, "Search this book..." from
Jupyter Book), not a catalogue message; it is looked up in the same
messages. Some names are written into the theme's templates without
gettext (``title="Toggle primary sidebar"``, ``aria-label="Page"``) or
into the scripts that make buttons in the reader's browser
(sphinx-togglebutton's ``aria-label="Toggle hidden content"``): after
the build, a ``title``, ``aria-label`` or ``alt`` attribute of a page or
of a script in ``_static`` whose whole value is one of the messages gets
its translation. The English book sets none.
"""
from __future__ import annotations

import gettext
import html
import re
from pathlib import Path

from sphinx import locale
from sphinx.application import Sphinx
from sphinx.config import Config


class Messages(gettext.NullTranslations):
    """A catalogue of ``messages`` (msgid -> text) in front of another."""

    def __init__(self, messages: dict[str, str],
                 behind: gettext.NullTranslations | None) -> None:
        super().__init__()
        self.messages = dict(messages)
        if behind is not None:
            self.add_fallback(behind)

    def gettext(self, message: str) -> str:
        if message in self.messages:
            return self.messages[message]
        return super().gettext(message)

    def ngettext(self, singular: str, plural: str, n: int) -> str:
        if n == 1 and singular in self.messages:
            return self.messages[singular]
        return super().ngettext(singular, plural, n)


def _install(app: Sphinx, config: Config) -> None:
    messages = config.ti_messages or {}
    if not isinstance(messages, dict) or not all(
            isinstance(k, str) and isinstance(v, str)
            for k, v in messages.items()):
        raise ValueError("ti_messages must map message strings to strings")
    if not messages:
        return
    # every catalogue registered so far (Sphinx's own, the themes'): the
    # templates read Sphinx's ("sphinx"), the book theme's buttons its own
    for key in list(locale.translators):
        locale.translators[key] = Messages(messages,
                                           locale.translators[key])
    app.translator = locale.translators["general", "sphinx"]
    options = config.html_theme_options
    text = options.get("search_bar_text")
    if text in messages:
        options["search_bar_text"] = messages[text]


def translate_attributes(text: str, messages: dict[str, str]) -> str:
    """``text`` (a page) with each ``title``, ``aria-label`` or ``alt``
    attribute whose value is a message replaced by its translation."""
    def swap(m: re.Match) -> str:
        value = html.unescape(m.group(2))
        if value not in messages:
            return m.group(0)
        return f'{m.group(1)}="{html.escape(messages[value])}"'
    return _ATTRIBUTE.sub(swap, text)


_ATTRIBUTE = re.compile(r'\b(title|aria-label|alt)="([^"]*)"')


def _translate_pages(app: Sphinx, exception) -> None:
    messages = app.config.ti_messages or {}
    if exception is not None or not messages or \
            app.builder.format != "html":
        return
    out = Path(app.outdir)
    for page in [*out.rglob("*.html"), *(out / "_static").rglob("*.js")]:
        text = page.read_text(encoding="utf-8")
        new = translate_attributes(text, messages)
        if new != text:
            page.write_text(new, encoding="utf-8")


def setup(app: Sphinx) -> dict:
    app.add_config_value("ti_messages", {}, "html")
    app.connect("config-inited", _install)
    app.connect("build-finished", _translate_pages)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
