"""Explorers and the display helpers shared with exercises."""
import base64
import json
import re

import pytest

from course_lib.validation import check_int
from course_lib.widgets import Explorer, markdown_to_html


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
    from course_lib.widgets import show_source

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
    from course_lib.widgets import show_source, source_lines
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
    from course_lib.widgets import show_source

    def plain(x):
        return x
    show_source(plain)
    assert "argument checks" not in capsys.readouterr().out


def test_markdown_emphasis_and_inline():
    # issue 13: "*all*" was shown with its asterisks
    html = markdown_to_html("weights of *all* layers, **bold**, 2*3*4, "
                            "a * b, `x*y*`, $a*b*c$")
    assert "<em>all</em>" in html and "<strong>bold</strong>" in html
    assert "2*3*4" in html and "a * b" in html
    assert "<code>x*y*</code>" in html and "$a*b*c$" in html
    line = markdown_to_html("It is *not* $b_i$.", tex_delimiters=True,
                            inline=True)
    assert line == r"It is <em>not</em> \(b_i\)."


def test_static_sliders_announce_their_value():
    ex = explorer()
    html = ex.static_html()
    assert 'aria-valuetext="' in html
    assert 'setAttribute("aria-valuetext"' in html
