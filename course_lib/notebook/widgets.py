"""Explorers: figures the reader drives with sliders, live or static.

An :class:`Explorer` wraps a drawing function ``draw(fig, **params)`` and a
small grid of parameter values. Displayed in a notebook it offers two views
of the same thing in one output:

* a live ipywidget (one slider per parameter) in Jupyter, Colab, VS Code,
  wherever a kernel runs;
* a self-contained HTML/JavaScript frame player for the HTML book, where no
  kernel runs: every combination of parameter values is pre-rendered to a PNG
  and the sliders swap frames. No control on the page is dead, and the page
  needs no CDN.

What the reader reads beside a slider is English text that goes through
:func:`~course_lib.notebook.i18n.tr`, so the Chinese edition shows it in
Chinese: the title, a label per control (``labels``: "head dimension d_k",
the quantity with the name the code uses beside it) and, for controls whose
values are words, a label per value (``value_labels``: ``"on"``,
``"pre-norm"``). The frames stay keyed by the values themselves; a value
with no label (a number) is shown as it is.

A front end shows the richest view it can render (the widget); the book's
``_config.yml`` drops the widget view for HTML so the player is shown.
Frames are drawn by :mod:`course_lib.notebook.frames` so that their text is
legible on a desktop and on a phone. This module also holds the small
display helpers that :mod:`course_lib.notebook.exercises` shares: Colab
detection and the mime bundle both kinds of object return.
"""
from __future__ import annotations

import base64
import html
import itertools
import json
import os
import re
import sys
from typing import Any, Callable, Mapping, Sequence

from .._util.validation import check_type
from .frames import (
    FRAME_DENSITY,
    clipped_texts,
    draw_frame,
    frame_font_pt,
    frame_png,
    smallest_text_pt,
)
from .i18n import tr
from .markdown import markdown_to_html

__all__ = ["in_colab", "check_key", "widget_bundle", "Explorer"]

_KEY_RE = re.compile(r"^[a-z0-9][a-z0-9-]*$")
MAX_FRAMES = 40  # page-weight budget: frames are inlined PNGs
_PRE_RENDERED = ("Pre-rendered frames for the slider values. To explore "
                 "freely, open this chapter in Colab (button at the top) or "
                 "Jupyter.")


def in_colab() -> bool:
    """True inside Google Colab (or the course's Colab simulation)."""
    return ("google.colab" in sys.modules
            or bool(os.environ.get("COURSE_SIMULATE_COLAB")))


def check_key(key: str) -> str:
    """Validate an explorer/exercise key, used to build HTML ids."""
    if not isinstance(key, str) or not _KEY_RE.match(key):
        raise ValueError(
            f"key must be a lowercase slug like 'ch01-decay', got {key!r}")
    return key


# --------------------------------------------------------------------------
# Display plumbing shared with exercises
# --------------------------------------------------------------------------
def widget_bundle(widget: Any, static_html: str, plain: str) -> dict:
    """Mime bundle with the live widget view and its HTML equivalent.

    On Colab the HTML is left out so that the widget is what gets shown.
    """
    bundle = {"text/plain": plain}
    if not in_colab():
        bundle["text/html"] = static_html
    model_id = getattr(widget, "model_id", None)
    if model_id:
        bundle["application/vnd.jupyter.widget-view+json"] = {
            "version_major": 2, "version_minor": 0, "model_id": model_id}
    return bundle


# --------------------------------------------------------------------------
# Explorer
# --------------------------------------------------------------------------
class Explorer:
    """A figure driven by sliders: a live widget and a static frame player.

    Args:
        key: a unique lowercase slug (``"ch01-grad-decay"``), used for HTML ids.
        title: one line shown above the figure.
        draw: ``draw(fig, **params)`` draws into an empty matplotlib Figure.
        controls: parameter name -> the values its slider steps through.
            The static player pre-renders every combination, so the product
            of the value counts must stay <= 40.
        initial: starting value per parameter (default: the middle value).
        figsize: figure size in inches. The book shows a frame at one CSS
            px per point (``figsize[0] * 72`` px wide) or the column width if
            that is less; 7.2 in fits a desktop column at body-size text and
            a phone at 11 px (see :func:`frame_font_pt`).
        dpi: device pixels per inch of the rendered frames (default
            ``72 * FRAME_DENSITY``: sharp on HiDPI screens, light pages).

    Every text of a frame is drawn at least :func:`frame_font_pt` points
    (rcParams for what the drawing leaves at its default, and smaller
    sizes set by hand are raised), with constrained layout, so that tick
    labels and legends read at body size on a desktop and at >= 11 CSS px
    on a 390 px phone.
        labels: display label per parameter, English, shown through
            ``tr()`` (default: its name): the quantity, with the name the
            code uses beside it (``{"d_k": "head dimension d_k"}``).
        value_labels: display text per value of a control whose values are
            words, ``{control: {value: text}}``, English, shown through
            ``tr()`` on the slider, in its read-out and to screen readers
            (``{"scaling": {"on": "on", "off": "off"}}``); a value left out
            is shown as itself.
    """

    def __init__(self, *, key: str, title: str,
                 draw: Callable[..., None],
                 controls: Mapping[str, Sequence[Any]],
                 initial: Mapping[str, Any] | None = None,
                 figsize: tuple[float, float] = (6.4, 3.6),
                 dpi: float | None = None,
                 labels: Mapping[str, str] | None = None,
                 value_labels: Mapping[str, Mapping[Any, str]] | None = None
                 ) -> None:
        self.key = check_key(key)
        if not callable(draw):
            raise ValueError(f"draw must be callable, got {draw!r}")
        if not isinstance(controls, Mapping) or not controls:
            raise ValueError(
                f"controls must be a non-empty dict, got {controls!r}")
        self.controls = {}
        for name, values in controls.items():
            values = list(values)
            if not values:
                raise ValueError(f"controls[{name!r}] is empty; expected "
                                 "at least one value")
            self.controls[name] = values
        n_frames = 1
        for values in self.controls.values():
            n_frames *= len(values)
        if n_frames > MAX_FRAMES:
            raise ValueError(
                f"controls give {n_frames} combinations; the static player "
                f"holds at most {MAX_FRAMES}: use fewer values")
        initial = dict(initial or {})
        unknown = set(initial) - set(self.controls)
        if unknown:
            raise ValueError(f"initial names unknown controls {sorted(unknown)}"
                             f"; controls are {list(self.controls)}")
        self.initial = {}
        for name, values in self.controls.items():
            value = initial.get(name, values[(len(values) - 1) // 2])
            if value not in values:
                raise ValueError(f"initial[{name!r}] = {value!r} is not one "
                                 f"of the control values {values}")
            self.initial[name] = value
        self.title, self.draw = title, draw
        if (not isinstance(figsize, (tuple, list)) or len(figsize) != 2
                or not all(isinstance(v, (int, float)) and not isinstance(
                    v, bool) and 0 < v < 100 for v in figsize)):
            raise ValueError(f"figsize must be (width, height) in inches, "
                             f"each in (0, 100), got {figsize!r}")
        if dpi is None:
            dpi = 72 * FRAME_DENSITY
        if (isinstance(dpi, bool) or not isinstance(dpi, (int, float))
                or not 20 <= dpi <= 600):
            raise ValueError(f"dpi must be a number in [20, 600], got {dpi!r}")
        self.figsize, self.dpi = (float(figsize[0]), float(figsize[1])), dpi
        self.font_pt = frame_font_pt(self.figsize[0])
        labels = dict(labels or {})
        value_labels = {n: dict(m) for n, m in (value_labels or {}).items()}
        for arg, named in (("labels", labels), ("value_labels", value_labels)):
            unknown = set(named) - set(self.controls)
            if unknown:
                raise ValueError(f"{arg} names unknown controls "
                                 f"{sorted(unknown)}; controls are "
                                 f"{list(self.controls)}")
        for name, texts in value_labels.items():
            unknown = [v for v in texts if v not in self.controls[name]]
            if unknown:
                raise ValueError(f"value_labels[{name!r}] names {unknown}, "
                                 f"not values of the control: "
                                 f"{self.controls[name]}")
            for text in texts.values():
                check_type(f"value_labels[{name!r}]", text, str, "str texts")
        for text in labels.values():
            check_type("labels", text, str, "a dict of str")
        self.labels = {n: labels.get(n, n) for n in self.controls}
        self.value_labels = {n: value_labels.get(n, {}) for n in self.controls}
        self._widget = None

    def shown(self, name: str, value: Any) -> str:
        """The text a reader sees for ``value`` of control ``name``: its
        label in the current language, else the value itself (``0.5``)."""
        texts = self.value_labels[name]
        return tr(texts[value]) if texts and value in texts else _fmt(value)

    # -- rendering ---------------------------------------------------------
    def render(self, **params: Any) -> Any:
        """Draw one frame and return the matplotlib Figure (see
        :func:`course_lib.notebook.frames.draw_frame`: text at least ``font_pt``)."""
        missing = set(self.controls) - set(params)
        if missing:
            raise ValueError(f"render() needs values for {sorted(missing)}")
        return draw_frame(self.draw, params, figsize=self.figsize)

    def _frame(self, **params: Any) -> tuple[bytes, float, list[str]]:
        """One frame as PNG bytes, its smallest text size in pt and the
        texts that stick out of the canvas."""
        fig = self.render(**params)
        png = frame_png(fig, dpi=self.dpi)
        return png, smallest_text_pt(fig), clipped_texts(fig)

    def png(self, **params: Any) -> bytes:
        """One frame as PNG bytes."""
        return self._frame(**params)[0]

    def combinations(self) -> list[dict]:
        """All parameter combinations, last control varying fastest."""
        names = list(self.controls)
        return [dict(zip(names, combo))
                for combo in itertools.product(*self.controls.values())]

    # -- static view -------------------------------------------------------
    def static_html(self) -> str:
        """A self-contained HTML/JS frame player (no kernel, no CDN)."""
        rendered = [self._frame(**p) for p in self.combinations()]
        frames = ["data:image/png;base64,"
                  + base64.b64encode(png).decode("ascii")
                  for png, _, _ in rendered]
        # What the browser tests check: the smallest text, in px of the
        # image's natural size, shows at font_px * shown / natural width;
        # no text is cut off at the frame's edge.
        font_px = min(pt for _, pt, _ in rendered) * self.dpi / 72
        clipped = html.escape(json.dumps(sorted(
            {t for _, _, texts in rendered for t in texts})[:5]))
        width_css = round(self.figsize[0] * 72)
        dom = f"ti-explorer-{self.key}"
        sliders = []
        for i, (name, values) in enumerate(self.controls.items()):
            idx = values.index(self.initial[name])
            shown = json.dumps([self.shown(name, v) for v in values],
                               ensure_ascii=False)
            now = html.escape(self.shown(name, self.initial[name]))
            sliders.append(
                f'<label class="ti-control" style="display:block">'
                f'{html.escape(tr(self.labels[name]))} '
                f'<input type="range" min="0" max="{len(values) - 1}" '
                f'step="1" value="{idx}" data-control="{i}" '
                f"data-values='{html.escape(shown, quote=True)}' "
                f'aria-label="{html.escape(tr(self.labels[name]))}" '
                f'aria-valuetext="{now}"> <output>{now}</output>'
                f'</label>')
        sizes = [len(v) for v in self.controls.values()]
        first = self.combinations().index(self.initial)
        alt = html.escape(tr("{title} (interactive figure)",
                             title=tr(self.title)))
        title = markdown_to_html(f"**{tr(self.title)}**",
                                 tex_delimiters=True)
        return f"""<div class="ti-explorer mathjax_process" id="{dom}">
<div class="ti-explorer-title">{title}</div>
<div class="ti-controls">{''.join(sliders)}</div>
<img class="ti-frame" alt="{alt}" src="{frames[first]}"
width="{width_css}" data-font-px="{font_px:.2f}"
data-clipped-text="{clipped}"
style="max-width:100%;height:auto">
<p class="ti-note"><em>{tr(_PRE_RENDERED)}</em></p>
<script type="application/json" class="ti-frames">{json.dumps(frames)}</script>
<script>
(function () {{
  var root = document.getElementById("{dom}");
  if (!root) return;
  var frames = JSON.parse(root.querySelector(".ti-frames").textContent);
  var sizes = {json.dumps(sizes)};
  var inputs = root.querySelectorAll("input[data-control]");
  var img = root.querySelector(".ti-frame");
  function update() {{
    var index = 0;
    inputs.forEach(function (el, i) {{
      var v = parseInt(el.value, 10);
      index = index * sizes[i] + v;
      var shown = JSON.parse(el.dataset.values)[v];
      el.nextElementSibling.textContent = shown;
      el.setAttribute("aria-valuetext", shown);   // read out, not the index
    }});
    img.src = frames[index];
  }}
  inputs.forEach(function (el) {{ el.addEventListener("input", update); }});
}})();
</script>
</div>"""

    # -- live view ---------------------------------------------------------
    def widget(self) -> Any:
        """The live ipywidget (built once)."""
        if self._widget is None:
            import ipywidgets as widgets

            sliders = {
                name: widgets.SelectionSlider(
                    options=[(self.shown(name, v), v) for v in values],
                    value=self.initial[name],
                    description=tr(self.labels[name]),
                    continuous_update=False,
                    style={"description_width": "initial"},
                    layout=widgets.Layout(width="420px"))
                for name, values in self.controls.items()}
            # An Image widget, not an Output widget: redrawing only swaps
            # PNG bytes, which works the same in ipywidgets 7 and 8 and in
            # kernels with no front end attached (nbclient, nbval).
            image = widgets.Image(format="png", width=str(round(
                self.figsize[0] * 72)), layout=widgets.Layout(
                    max_width="100%", height="auto"))

            def redraw(change: Any = None) -> None:
                params = {n: s.value for n, s in sliders.items()}
                image.value = self.png(**params)

            for s in sliders.values():
                s.observe(redraw, names="value")
            redraw()
            title = widgets.HTMLMath(markdown_to_html(
                f"**{tr(self.title)}**"))
            self._widget = widgets.VBox([title, *sliders.values(), image])
            self.sliders, self.image = sliders, image
        return self._widget

    def _repr_mimebundle_(self, include: Any = None,
                          exclude: Any = None) -> dict:
        return widget_bundle(self.widget(), self.static_html(), repr(self))

    def __repr__(self) -> str:
        names = ", ".join(self.controls)
        return f"Explorer({self.key!r}: {self.title} [{names}])"


def _fmt(value: Any) -> str:
    """Short, stable label for a control value."""
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)
