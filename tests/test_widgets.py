"""Explorers and the display helpers shared with exercises."""
import base64
import json
import re

import pytest

from course_lib._util.validation import check_int
from course_lib.notebook.widgets import Explorer
from course_lib.notebook.markdown import markdown_to_html


def draw(fig, *, a, b):
    ax = fig.add_subplot()
    ax.plot([0, 1], [b, a + b])
    ax.set_title(f"a={a}, b={b}")


def explorer(**kw):
    return Explorer(key="t-line", title="A line", draw=draw,
                    controls={"a": [1, 2, 3], "b": [0.0, 0.5]}, **kw)


def frames_of(html):
    payload = re.search(r'class="ti-frames">(.*?)</script>', html, re.S)
    return json.loads(payload.group(1))


def test_static_player_has_one_distinct_frame_per_combination():
    ex = explorer()
    html = ex.static_html()
    frames = frames_of(html)
    assert len(frames) == 6
    assert len(set(frames)) == 6          # every combination drawn anew
    for f in frames:
        png = base64.b64decode(f.split(",", 1)[1])
        assert png[:8] == b"\x89PNG\r\n\x1a\n"


def test_static_player_frame_order_matches_slider_arithmetic():
    # The JS computes index = idx_a * len(b) + idx_b: check that the frame
    # at that index is the one drawn for those values.
    ex = explorer()
    frames = frames_of(ex.static_html())
    combos = ex.combinations()
    for i_a, a in enumerate(ex.controls["a"]):
        for i_b, b in enumerate(ex.controls["b"]):
            assert combos[i_a * 2 + i_b] == {"a": a, "b": b}
    assert frames[3].endswith(base64.b64encode(ex.png(a=2, b=0.5))
                              .decode()[-40:])


def test_initial_frame_shown_first():
    ex = explorer(initial={"a": 3, "b": 0.5})
    html = ex.static_html()
    first_src = re.search(r'<img class="ti-frame" alt="[^"]*" src="([^"]+)"',
                          html).group(1)
    assert first_src == frames_of(html)[5]
    assert 'value="2"' in html and 'value="1"' in html


def test_default_initial_is_middle_value():
    assert explorer().initial == {"a": 2, "b": 0.0}


def test_live_widget_redraws_on_slider_change():
    ex = explorer()
    ex.widget()
    before = ex.image.value
    ex.sliders["a"].value = 3
    assert ex.image.value != before
    assert ex.image.value == ex.png(a=3, b=0.0)


@pytest.mark.parametrize("kwargs,needle", [
    (dict(controls={}), "non-empty dict"),
    (dict(controls={"a": []}), "is empty"),
    (dict(controls={"a": list(range(9)), "b": list(range(5))}),
     "45 combinations"),
    (dict(controls={"a": [1]}, initial={"a": 2}), "not one of the control"),
    (dict(controls={"a": [1]}, initial={"z": 2}), "unknown controls"),
    (dict(controls={"a": [1]}, key="Has Space"), "lowercase slug"),
    (dict(controls={"a": [1]}, draw=None), "draw must be callable"),
])
def test_bad_explorer_arguments(kwargs, needle):
    args = dict(key="t-x", title="t", draw=draw)
    args.update(kwargs)
    with pytest.raises(ValueError, match=needle):
        Explorer(**args)


def test_render_requires_all_params():
    with pytest.raises(ValueError, match="needs values"):
        explorer().render(a=1)


def test_markdown_subset():
    html = markdown_to_html("Para with `x<y` and **bold** and $a<b$.\n\n"
                            "```python\nif a < b:\n    pass\n```\nEnd.")
    assert "<code>x&lt;y</code>" in html
    assert "<strong>bold</strong>" in html
    assert "$a&lt;b$" in html
    assert '<pre class="ti-code"><code>if a &lt; b:\n    pass</code></pre>' \
        in html
    assert html.count("<p>") == 2
    assert "<script" not in markdown_to_html("<script>alert(1)</script>")
    tex = markdown_to_html("$x$ and $$y$$", tex_delimiters=True)
    assert r"\(x\)" in tex and r"\[y\]" in tex


def test_show_source_prints_code_without_docstring(capsys):
    from course_lib.notebook.source import show_source

    def documented(x):
        r"""Docstring that the chapter's prose already explains.

        More lines.
        """
        return x + 1  # the code itself

    show_source(documented)
    out = capsys.readouterr().out
    assert "Docstring" not in out and "More lines" not in out
    assert "def documented(x):" in out and "return x + 1" in out


def _guarded(x, n):
    """Docstring."""
    check_int("n", n, minimum=1)
    if n > 10:
        raise ValueError("n too big")
    y = x * n  # the idea
    if y > 3:
        y = 3
    return y


def test_show_source_hides_argument_checks_and_marks_the_cut(capsys):
    from course_lib.notebook.source import show_source, source_lines
    show_source(_guarded)
    out = capsys.readouterr().out
    assert out.rstrip("\n").splitlines() == [
        "def _guarded(x, n):",
        "    # (argument checks left out)",
        "    y = x * n  # the idea",
        "    if y > 3:",         # an `if` that does not only raise stays
        "        y = 3",
        "    return y"]
    full = source_lines(_guarded, checks=True)
    assert 'check_int("n", n, minimum=1)' in full
    assert 'raise ValueError("n too big")' in full and "Docstring" not in full


def test_show_source_without_checks_adds_no_marker(capsys):
    from course_lib.notebook.source import show_source

    def plain(x):
        return x
    show_source(plain)
    assert "argument checks" not in capsys.readouterr().out


def test_markdown_emphasis_and_inline():
    # "*all*" was shown with its asterisks, not in italics
    html = markdown_to_html("weights of *all* layers, **bold**, 2*3*4, "
                            "a * b, `x*y*`, $a*b*c$")
    assert "<em>all</em>" in html and "<strong>bold</strong>" in html
    assert "2*3*4" in html and "a * b" in html
    assert "<code>x*y*</code>" in html and "$a*b*c$" in html
    line = markdown_to_html("It is *not* $b_i$.", tex_delimiters=True,
                            inline=True)
    assert line == r"It is <em>not</em> \(b_i\)."
    # Chinese: no spaces around words, emphasis still renders
    assert markdown_to_html("但*不*除以", inline=True) == "但<em>不</em>除以"
    assert markdown_to_html("2*3*4 与 x*y", inline=True) == "2*3*4 与 x*y"


def test_static_sliders_announce_their_value():
    ex = explorer()
    html = ex.static_html()
    assert 'aria-valuetext="' in html
    assert 'setAttribute("aria-valuetext"' in html


# -- legible frames --------------------------------------------------------
def crowded(fig, *, a):
    """Sizes set by hand below the limit, ticks made at draw time, and a
    tight_layout call, as chapters' drawing functions do."""
    ax1, ax2 = fig.subplots(1, 2)
    ax1.plot(range(10), [a * i for i in range(10)], label="a line")
    ax1.legend(fontsize=6)
    ax1.set_title("left", fontsize=7)
    ax1.tick_params(labelsize=5)
    ax2.bar(range(3), [1, 2, 3])
    ax2.set_xticks(range(3), ["x", "y", "z"], fontsize=6)
    ax2.text(0, 2, "note", fontsize=4)
    ax2.set_xlabel("a label")
    fig.tight_layout()


def test_frame_font_closed_form():
    from course_lib.notebook.frames import frame_font_pt
    assert frame_font_pt(7.2) == 16                 # 518 pt: 16 * 358/518 > 11
    for w in (8.0, 10.0):
        f = frame_font_pt(w)
        assert f > 16 and f * 358 / (72 * w) == pytest.approx(11)
    with pytest.raises(ValueError, match="width_in"):
        frame_font_pt(-1)


@pytest.mark.parametrize("width", [6.4, 7.2, 9.0])
def test_every_text_of_a_frame_is_at_least_the_frame_font(width):
    from course_lib.notebook.frames import frame_font_pt
    from matplotlib.text import Text
    ex = Explorer(key="t-c", title="t", draw=crowded, controls={"a": [1]},
                  figsize=(width, 3.2))
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    fig = ex.render(a=1)
    canvas = FigureCanvasAgg(fig)
    canvas.draw()                                    # ticks made now count
    texts = [t for t in fig.findobj(Text) if t.get_visible()
             and t.get_text().strip()]
    assert len(texts) > 10
    assert min(t.get_fontsize() for t in texts) >= frame_font_pt(width)
    # drawn at that size: a glyph box is about as tall as the font size
    renderer = canvas.get_renderer()
    note = next(t for t in texts if t.get_text() == "note")
    height = note.get_window_extent(renderer).height * 72 / fig.dpi
    assert height >= 0.9 * frame_font_pt(width)
    # and laid out inside the canvas, not cut off at its edge (tick labels
    # of ticks outside the view limits are not drawn)
    hidden = set()
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            lo, hi = sorted(axis.get_view_interval())
            hidden |= {id(label) for tick in axis.get_major_ticks()
                       + axis.get_minor_ticks()
                       if not lo - 1e-9 <= tick.get_loc() <= hi + 1e-9
                       for label in (tick.label1, tick.label2)}
    box = fig.bbox
    for t in (t for t in texts if id(t) not in hidden):
        e = t.get_window_extent(renderer)
        assert e.x0 >= box.x0 - 1 and e.x1 <= box.x1 + 1, t.get_text()
        assert e.y0 >= box.y0 - 1 and e.y1 <= box.y1 + 1, t.get_text()


def test_frame_png_size_palette_and_recorded_font():
    import io

    from PIL import Image

    from course_lib.notebook.frames import FRAME_DENSITY, frame_font_pt
    ex = Explorer(key="t-c", title="t", draw=crowded,
                  controls={"a": [1, 2]}, figsize=(7.2, 3.2))
    png = ex.png(a=1)
    image = Image.open(io.BytesIO(png))
    assert image.size == (int(7.2 * 72 * FRAME_DENSITY),
                          int(3.2 * 72 * FRAME_DENSITY))
    assert image.mode == "P"                         # 256-colour palette
    # the palette keeps the picture: compare with the full-colour render
    from course_lib.notebook.frames import figure_to_png
    full = Image.open(io.BytesIO(figure_to_png(
        ex.render(a=1), dpi=ex.dpi, tight=False))).convert("RGB")
    diff = [abs(p - q) for p, q in zip(image.convert("RGB").tobytes(),
                                       full.tobytes())]
    assert sum(diff) / len(diff) < 1.0 and len(png) < len(figure_to_png(
        ex.render(a=1), dpi=ex.dpi, tight=False))
    html = ex.static_html()
    img = re.search(r'<img class="ti-frame"[^>]*>', html).group(0)
    assert 'width="518"' in img                      # 7.2 in at 1 px per pt
    font_px = float(re.search(r'data-font-px="([\d.]+)"', img).group(1))
    assert font_px == pytest.approx(frame_font_pt(7.2) * FRAME_DENSITY)


def test_recorded_font_is_the_smallest_drawn():
    def big(fig, *, a):
        ax = fig.add_subplot()
        ax.plot([0, 1], [0, a])
        for t in (ax.set_title("t", fontsize=30), ax.set_xlabel("x"),
                  ax.set_ylabel("y")):
            t.set_fontsize(30)
        ax.tick_params(labelsize=25)
    ex = Explorer(key="t-b", title="t", draw=big, controls={"a": [1]},
                  figsize=(7.2, 3.2), dpi=72)
    img = re.search(r'<img class="ti-frame"[^>]*>', ex.static_html()).group(0)
    assert 'data-font-px="25.00"' in img


@pytest.mark.parametrize("kwargs,needle", [
    (dict(figsize=(0, 3)), "figsize"), (dict(figsize="big"), "figsize"),
    (dict(dpi=0), "dpi"), (dict(dpi="72"), "dpi")])
def test_bad_frame_geometry(kwargs, needle):
    with pytest.raises(ValueError, match=needle):
        Explorer(key="t-x", title="t", draw=draw, controls={"a": [1]},
                 **kwargs)


@pytest.mark.filterwarnings("ignore:constrained_layout not applied")
def test_text_cut_off_at_the_frame_edge_is_reported():
    from course_lib.notebook.frames import clipped_texts

    def long_title(fig, *, a):
        ax = fig.add_subplot()
        ax.plot([0, 1], [0, a])
        ax.text(0, a / 2, "a label far too long for a frame of this width, "
                "however it is laid out " * a)
    ok = Explorer(key="t-c", title="t", draw=crowded, controls={"a": [1]},
                  figsize=(7.2, 3.2))
    assert clipped_texts(ok.render(a=1)) == []
    assert 'data-clipped-text="[]"' in ok.static_html()
    bad = Explorer(key="t-l", title="t", draw=long_title,
                   controls={"a": [1, 2]}, figsize=(7.2, 3.2))
    fig = bad.render(a=1)
    assert clipped_texts(fig) == [fig.axes[0].texts[0].get_text()]
    img = re.search(r'<img class="ti-frame"[^>]*>', bad.static_html()).group(0)
    assert "a label far too long" in img and "[]" not in img


def test_a_title_too_long_for_the_frame_wraps_inside_it():
    from course_lib.notebook.frames import clipped_texts

    def long_title(fig, *, a):
        ax = fig.add_subplot()
        ax.plot([0, 1], [0, a])
        ax.set_title("layer 1, head 0: previous (1st seg.) 0.43, "
                     "induction 0.91", fontsize=8)
        fig.suptitle("a suptitle that is also much too long for this "
                     "narrow frame")
    ex = Explorer(key="t-w", title="t", draw=long_title,
                  controls={"a": [1]}, figsize=(5, 4))
    fig = ex.render(a=1)
    assert clipped_texts(fig) == []
    height = fig.axes[0].title.get_window_extent(
        fig.canvas.get_renderer()).height
    assert height > 1.8 * ex.font_pt * fig.dpi / 72     # two lines


def test_flags_of_the_notebook_helpers_must_be_bools():
    from matplotlib.figure import Figure
    from course_lib.notebook.frames import figure_to_png
    from course_lib.notebook.source import source_lines
    with pytest.raises(TypeError, match="inline"):
        markdown_to_html("x", inline="False")
    with pytest.raises(TypeError, match="tex_delimiters"):
        markdown_to_html("x", tex_delimiters=1)
    with pytest.raises(TypeError, match="checks"):
        source_lines(markdown_to_html, checks="False")
    with pytest.raises(TypeError, match="palette"):
        figure_to_png(Figure(), palette="False")


def check_shape_of(x):
    """Stand-in for a course_lib check (only its name matters here)."""


check_size_of = check_shape_of


def _checked(x, n=None):
    """Docstring."""
    # a comment that explains the check below
    check_shape_of(x)
    if n is not None:
        check_size_of(n)
    # the idea starts here
    return x + 1


def test_source_lines_hides_checks_with_their_comments():
    from course_lib.notebook.source import source_lines
    text = source_lines(_checked)
    assert text.splitlines() == [
        "def _checked(x, n=None):",
        "    # (argument checks left out)",
        "    # the idea starts here",
        "    return x + 1"]
    assert "check_size_of" in source_lines(_checked, checks=True)
