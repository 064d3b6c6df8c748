"""Explorer frames a reader can read: matplotlib figures drawn with text
at body size and saved as light PNGs.

A frame is shown in the book's text column at one CSS px per point of the
figure (``<img width>`` = ``figsize[0] * 72``), never wider than the
column (``max-width: 100%``): on a phone it shrinks to the column. Its
tick labels, legends and annotations must read at the body-text size on
a desktop screen and stay legible on a 390 px phone; :func:`draw_frame`
sees to both, whatever sizes the drawing function asked for, and
:func:`figure_to_png` stores the frame at ``FRAME_DENSITY`` device pixels
per CSS px with a 256-colour palette.
"""
from __future__ import annotations

import io
import warnings
from typing import Any, Callable, Mapping

from .._util.validation import check_bool, check_real
from .figure_text import translate_figure

__all__ = ["BODY_PX", "PHONE_COLUMN_PX", "PHONE_MIN_PX", "FRAME_DENSITY",
           "frame_font_pt", "draw_frame", "smallest_text_pt", "clipped_texts",
           "frame_png", "figure_to_png"]

BODY_PX = 16            # the book's body text (a paragraph's font-size)
PHONE_COLUMN_PX = 358   # text column at a 390 px wide phone viewport
PHONE_MIN_PX = 11       # smallest text a phone reader reads comfortably
FRAME_DENSITY = 2       # device pixels per CSS px: sharp on HiDPI screens


def frame_font_pt(width_in: float) -> float:
    r"""Smallest font size (pt) for text in a frame ``width_in`` inches wide.

    At one point per CSS px, text of ``f`` pt in a frame :math:`W = 72\,w`
    pt wide shows at ``f`` px on a desktop and at :math:`f \cdot 358 / W`
    px on a 390 px phone, so :math:`f = \max(16,\; 11 \cdot 72\,w / 358)`
    meets both limits: 16 pt up to ``w = 7.23`` in, more for wider frames.
    """
    check_real("width_in", width_in, positive=True, maximum=100)
    return max(float(BODY_PX), PHONE_MIN_PX * 72 * width_in / PHONE_COLUMN_PX)


def _frame_style(font_pt: float) -> dict:
    """rcParams that draw every text of a frame at ``font_pt``."""
    keys = ("font.size", "axes.titlesize", "axes.labelsize",
            "xtick.labelsize", "ytick.labelsize", "legend.fontsize",
            "legend.title_fontsize", "figure.titlesize")
    return {**dict.fromkeys(keys, font_pt), "axes.titlepad": 4.0,
            "legend.borderaxespad": 0.3, "legend.labelspacing": 0.3,
            "legend.handlelength": 1.5, "legend.columnspacing": 1.0}


def _raise_small_text(fig: Any, font_pt: float) -> None:
    """Raise every text of ``fig`` set smaller by hand (``fontsize=8``,
    ``tick_params(labelsize=...)``) to ``font_pt``; tick labels through
    ``tick_params``, so that ticks made at draw time follow. Titles and
    axis labels wrap at the frame's edge instead of running off it."""
    from matplotlib.text import Text
    for ax in fig.axes:
        for name, axis in (("x", ax.xaxis), ("y", ax.yaxis)):
            ticks = axis.get_major_ticks() + axis.get_minor_ticks()
            if any(t.label1.get_fontsize() < font_pt for t in ticks):
                ax.tick_params(axis=name, which="both", labelsize=font_pt)
    for text in fig.findobj(Text):
        if text.get_fontsize() < font_pt:
            text.set_fontsize(font_pt)
    # titles and labels too long for the frame wrap at its edge
    for text in [t for ax in fig.axes for t in (
            ax.title, ax.xaxis.label, ax.yaxis.label)] + list(fig.texts):
        text.set_wrap(True)


def draw_frame(draw: Callable[..., None], params: Mapping[str, Any], *,
               figsize: tuple[float, float]) -> Any:
    """Call ``draw(fig, **params)`` on a new Figure of ``figsize`` inches
    and return it, every text at least ``frame_font_pt(figsize[0])`` pt.

    The drawing runs under rcParams that make that size the default, with
    constrained layout (compressed if an Axes has a fixed aspect);
    afterwards any text it made smaller is raised. A drawing that calls
    ``fig.tight_layout()`` gets it again after that.
    """
    import matplotlib as mpl
    from matplotlib.figure import Figure
    from matplotlib.layout_engine import ConstrainedLayoutEngine
    if not callable(draw):
        raise ValueError(f"draw must be callable, got {draw!r}")
    if not isinstance(params, Mapping):
        raise ValueError(f"params must be a dict, got {params!r}")
    if (not isinstance(figsize, (tuple, list)) or len(figsize) != 2
            or not all(isinstance(v, (int, float)) and not isinstance(
                v, bool) and 0 < v < 100 for v in figsize)):
        raise ValueError(f"figsize must be (width, height) in inches, "
                         f"each in (0, 100), got {figsize!r}")
    font_pt = frame_font_pt(figsize[0])
    with mpl.rc_context(_frame_style(font_pt)), warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message="The figure layout has changed to tight")
        fig = Figure(figsize=tuple(figsize), layout="constrained")
        draw(fig, **params)
        translate_figure(fig)        # a no-op in English
        _raise_small_text(fig, font_pt)
        if not isinstance(fig.get_layout_engine(),       # draw ran
                          ConstrainedLayoutEngine):      # tight_layout
            fig.tight_layout(pad=0.3)
        elif any(ax.get_aspect() != "auto" for ax in fig.axes):
            # fixed-aspect Axes (imshow, aspect="equal"): plain
            # constrained layout can push their labels off the canvas
            fig.set_layout_engine("compressed")
    return fig


def smallest_text_pt(fig: Any) -> float:
    """Size (pt) of the smallest non-empty visible text of ``fig``."""
    from matplotlib.text import Text
    if not hasattr(fig, "findobj"):
        raise TypeError(f"fig must be a matplotlib Figure, got "
                        f"{type(fig).__name__}")
    sizes = [t.get_fontsize() for t in fig.findobj(Text)
             if t.get_visible() and t.get_text().strip()]
    return min(sizes, default=float("inf"))


def clipped_texts(fig: Any) -> list[str]:
    """Texts of ``fig`` that stick out of its canvas, where a reader sees
    them cut off (the figure is drawn once, on an Agg canvas, at its own
    dpi). Tick labels of ticks outside the view limits are not drawn and
    do not count."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.text import Text
    if not hasattr(fig, "findobj") or not hasattr(fig, "bbox"):
        raise TypeError(f"fig must be a matplotlib Figure, got "
                        f"{type(fig).__name__}")
    if not isinstance(fig.canvas, FigureCanvasAgg):
        FigureCanvasAgg(fig).draw()
    renderer = fig.canvas.get_renderer()
    hidden = set()
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            lo, hi = sorted(axis.get_view_interval())
            span = 1e-9 * max(1.0, abs(hi - lo))
            hidden |= {id(label) for tick in axis.get_major_ticks()
                       + axis.get_minor_ticks()
                       if not lo - span <= tick.get_loc() <= hi + span
                       for label in (tick.label1, tick.label2)}
    box, out = fig.bbox, []
    for t in fig.findobj(Text):
        if not t.get_visible() or not t.get_text().strip() or id(t) in hidden:
            continue
        e = t.get_window_extent(renderer)
        if (e.x0 < box.x0 - 1 or e.x1 > box.x1 + 1 or e.y0 < box.y0 - 1
                or e.y1 > box.y1 + 1):
            out.append(t.get_text())
    return out


def frame_png(fig: Any, *, dpi: float) -> bytes:
    """Draw ``fig`` once at ``dpi`` on an Agg canvas (left attached, so
    that :func:`clipped_texts` reads the same layout) and return it as a
    256-colour PNG of exactly ``figsize * dpi`` pixels."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from PIL import Image
    check_real("dpi", dpi, positive=True)
    if not hasattr(fig, "set_dpi"):
        raise TypeError(f"fig must be a matplotlib Figure, got "
                        f"{type(fig).__name__}")
    fig.set_dpi(dpi)
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    image = Image.frombuffer("RGBA", canvas.get_width_height(),
                             canvas.buffer_rgba(), "raw", "RGBA", 0, 1)
    return _palette_png(image)


def _palette_png(image: Any) -> bytes:
    """``image`` as a PNG with an adaptive 256-colour palette: line art and
    text lose nothing visible, and the file shrinks to about 40%."""
    from PIL import Image
    out = io.BytesIO()
    image.convert("RGB").quantize(
        256, method=Image.Quantize.MEDIANCUT,
        dither=Image.Dither.NONE).save(out, format="png", optimize=True)
    return out.getvalue()


def figure_to_png(fig: Any, *, dpi: float = 72, tight: bool = True,
                  palette: bool = False) -> bytes:
    """Render a matplotlib Figure to PNG bytes (no pyplot state touched).

    ``tight`` crops the saved image to what is drawn (``bbox_inches``);
    without it the image is exactly ``figsize * dpi`` pixels. ``palette``
    stores at most 256 colours (see :func:`frame_png`).
    """
    if not hasattr(fig, "savefig"):
        raise TypeError(f"fig must be a matplotlib Figure, got "
                        f"{type(fig).__name__}")
    check_real("dpi", dpi, positive=True)
    check_bool("tight", tight)
    check_bool("palette", palette)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi,
                bbox_inches="tight" if tight else None)
    if not palette:
        return buf.getvalue()
    from PIL import Image
    return _palette_png(Image.open(io.BytesIO(buf.getvalue())))
