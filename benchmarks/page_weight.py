"""Bytes a reader's browser transfers for each page of the built book.

For every HTML page: the page itself plus the images it shows (inlined
images are part of the HTML). Scripts, style sheets and fonts under
``_static/`` (the theme, MathJax) are shared by all pages and cached after
the first, so they are counted once, in their own row.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urldefrag

IMG_SRC = re.compile(r'<img[^>]+src="([^"]+)"')


@dataclass
class PageWeight:
    page: str          # site-relative path
    html_bytes: int
    image_bytes: int

    @property
    def total(self) -> int:
        return self.html_bytes + self.image_bytes


def page_weight(site: Path, rel: str) -> PageWeight:
    path = site / rel
    html = path.read_text(encoding="utf-8")
    images = 0
    seen = set()
    for src in IMG_SRC.findall(html):
        if src.startswith(("data:", "http:", "https:")):
            continue
        target = (path.parent / unquote(urldefrag(src)[0])).resolve()
        if target not in seen and target.exists():
            seen.add(target)
            images += target.stat().st_size
    return PageWeight(rel, path.stat().st_size, images)


def shared_bytes(site: Path) -> int:
    """Everything under _static/ (theme, scripts, fonts, MathJax)."""
    return sum(f.stat().st_size for f in (site / "_static").rglob("*")
               if f.is_file())
