"""Serve MathJax from the built site instead of a CDN, when it is vendored.

``make vendor`` installs MathJax 3 from the npm registry into
``_build/vendor/node_modules`` (a pinned, declared dependency in
``book/_ext/package.json``; nothing third-party is committed). When that
copy exists, this extension adds it to the static files and points Sphinx's
``mathjax_path`` at it, so pages render math offline and behind firewalls.
When it does not (no npm on the machine), the build still succeeds, uses
the CDN, and says so in the log.
"""
import os
import shutil
from pathlib import Path

from sphinx.application import Sphinx
from sphinx.util import logging

logger = logging.getLogger(__name__)
ROOT = Path(__file__).resolve().parents[2]
MATHJAX = ROOT / "_build" / "vendor" / "node_modules" / "mathjax" / "es5"
STATIC = ROOT / "_build" / "vendor" / "static"
# The parts of MathJax's 24 MB es5 tree that tex-chtml.js loads: itself, its
# web fonts, TeX extensions loaded on demand, and the menu's lazy modules.
MATHJAX_PARTS = ["tex-chtml.js", "output/chtml/fonts/woff-v2",
                 "input/tex/extensions", "a11y", "ui", "adaptors"]


def _stage_mathjax() -> None:
    """Copy the needed MathJax files to STATIC/mathjax (once). The English
    and the Chinese book are built at the same time (Makefile): each
    copies into a folder of its own and renames it into place, so neither
    build can see a half-copied tree."""
    target = STATIC / "mathjax"
    if target.exists():
        return
    # (outside STATIC, which Sphinx copies whole into the site)
    staging = STATIC.parent / f"mathjax-staging.{os.getpid()}"
    for part in MATHJAX_PARTS:
        src, dst = MATHJAX / part, staging / part
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, dst, dirs_exist_ok=True)
        else:
            shutil.copy2(src, dst)
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        staging.rename(target)
    except OSError:                 # the other build was first: same files
        shutil.rmtree(staging)


def _configure(app: Sphinx, config) -> None:
    if (MATHJAX / "tex-chtml.js").exists():
        _stage_mathjax()
        config.html_static_path.append(str(STATIC))
        config.mathjax_path = "mathjax/tex-chtml.js"
        logger.info("vendor_assets: MathJax served from the site (%s)",
                    MATHJAX)
    else:
        logger.info("vendor_assets: %s missing (run `make vendor`; needs "
                    "npm): falling back to MathJax from the CDN", MATHJAX)


def setup(app: Sphinx) -> dict:
    app.connect("config-inited", _configure)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
