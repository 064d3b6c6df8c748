"""Tests for course_lib.notebook.figure_text: figures in Chinese.

References: the catalogue's own entries (exact and template matches, the
drawn values carried over), matplotlib's own glyph lookup (every
character of the Chinese text is in the bundled font or in DejaVu Sans),
and matplotlib's warnings and log (a Chinese label with maths draws
without a missing-glyph complaint).
"""
import io
import logging
import re
import warnings

import matplotlib
import pytest

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib import font_manager  # noqa: E402
from matplotlib.ft2font import FT2Font  # noqa: E402

from course_lib.notebook import figure_text, i18n  # noqa: E402
from course_lib.notebook.frames import draw_frame  # noqa: E402

CATALOG = {"density": "密度",
           "d_k = {d}, std {s.std().item():.1f}": "d_k = {d}，标准差 {s.std().item():.1f}",
           "{a} then {b}": "先 {a} 后 {b}",
           "{name}": "不该匹配"}


@pytest.fixture
def toy_catalog(monkeypatch):
    monkeypatch.setattr(i18n, "catalog", lambda language: CATALOG)
    figure_text._compiled.cache_clear()
    yield
    figure_text._compiled.cache_clear()


@pytest.fixture
def chinese():
    i18n.set_language("zh")
    yield
    i18n.set_language("en")
    plt.close("all")


def test_exact_and_template_entries_carry_the_drawn_values(toy_catalog):
    tr = figure_text.translate_text
    assert tr("density", "zh") == "密度"
    assert tr("d_k = 64, std 8.1", "zh") == "d_k = 64，标准差 8.1"
    assert tr("x then y", "zh") == "先 x 后 y"
    assert tr("a field alone matches nothing", "zh") is None
    assert tr("0.5", "zh") is None                      # tick labels stay


def test_a_figure_translates_once_however_often_it_draws(toy_catalog, chinese):
    fig, ax = plt.subplots()
    ax.set_title("d_k = 16, std 3.9")
    ax.plot([0, 1], label="density")
    ax.legend()
    fig.savefig(io.BytesIO(), bbox_inches="tight")  # 2 draws
    fig.canvas.draw()
    assert ax.get_title() == "d_k = 16，标准差 3.9"
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["密度"]
    assert figure_text.translate_figure(fig) == 0      # nothing left


def test_english_is_untouched_and_settings_come_back(toy_catalog):
    family = list(matplotlib.rcParams["font.family"])
    hooks = list(matplotlib.rcParams["figure.hooks"])
    fig, ax = plt.subplots()
    ax.set_title("density")
    fig.canvas.draw()
    assert ax.get_title() == "density"
    i18n.set_language("zh")
    assert matplotlib.rcParams["font.family"][0] == "Course CJK SC"
    i18n.set_language("en")
    assert list(matplotlib.rcParams["font.family"]) == family
    assert list(matplotlib.rcParams["figure.hooks"]) == hooks
    plt.close("all")


def test_explorer_frames_translate(toy_catalog, chinese):
    def draw(fig, d):
        fig.subplots().set_xlabel("density")
    fig = draw_frame(draw, {"d": 1}, figsize=(4, 3))
    assert fig.axes[0].get_xlabel() == "密度"


def test_every_character_of_the_chinese_text_has_a_glyph():
    """Each character a figure or widget may show in Chinese is in the
    bundled font or in DejaVu Sans (else: rerun scripts/make_cjk_font.py)."""
    fonts = [FT2Font(str(figure_text.FONT_PATH)),
             FT2Font(font_manager.findfont("DejaVu Sans"))]
    texts = list(i18n.catalog("zh").values())
    missing = sorted({c for text in texts for c in text
                      if not c.isspace() and ord(c) > 0x7f
                      and all(f.get_char_index(ord(c)) == 0 for f in fonts)})
    assert not missing, (f"no glyph for {''.join(missing)!r}: run "
                         "python scripts/make_cjk_font.py")
    # with maths in a label, mathtext draws the rest with the first font
    # only: those characters must be in the bundled font itself
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(root / "scripts"))
    from figure_strings import figure_strings
    zh = i18n.catalog("zh")
    drawn = [zh.get(t, t) for nb in sorted((root / "book").glob("ch*.ipynb"))
             for t in figure_strings(nb)]
    outside = {c for text in drawn if "$" in text
               for c in re.sub(r"\$[^$]*\$", "", text)
               if not c.isspace() and fonts[0].get_char_index(ord(c)) == 0}
    assert not outside, (f"{''.join(sorted(outside))!r} next to maths "
                         "need the CJK font: add them in make_cjk_font.py")


def test_chinese_with_maths_draws_without_a_missing_glyph(chinese, caplog):
    fig, ax = plt.subplots()
    ax.set_xlabel("$d_k$（每个头的维度）")
    ax.set_title("原始分数 q·k 的方差：√d_k 倍")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with caplog.at_level(logging.WARNING, logger="matplotlib"):
            fig.canvas.draw()
    assert not caplog.records, [r.getMessage() for r in caplog.records]


def test_bad_input():
    with pytest.raises(TypeError, match="fig"):
        figure_text.translate_figure("not a figure")
    with pytest.raises(TypeError, match="on"):
        figure_text.enable("yes")
    with pytest.raises(ValueError, match="language"):
        figure_text.translate_text("density", "fr")


def test_the_font_is_package_data():
    import tomllib
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    data = tomllib.loads((root / "pyproject.toml").read_text())
    globs = data["tool"]["setuptools"]["package-data"]["course_lib.notebook"]
    assert "fonts/*.otf" in globs and "fonts/OFL.txt" in globs
    assert figure_text.FONT_PATH.stat().st_size < 2_500_000


def test_word_tick_labels_translate_and_specific_templates_win(
        monkeypatch, chinese):
    monkeypatch.setattr(i18n, "catalog", lambda language: {
        "total": "总数", "layer {i}": "第 {i} 层",
        "top-{k}, {how}": "前 {k} 个，{how}",
        "top-{k}, raw scores": "前 {k} 个，原始分数"})
    figure_text._compiled.cache_clear()
    fig, (a, b) = plt.subplots(1, 2)
    a.bar(["total", "other"], [1, 2])                    # categories
    b.set_yticks([0, 1], labels=["layer 1", "layer 2"])  # fixed labels
    b.set_title("top-2, raw scores")
    fig.canvas.draw()
    assert [t.get_text() for t in a.get_xticklabels()] == ["总数", "other"]
    assert [t.get_text() for t in b.get_yticklabels()] == ["第 1 层",
                                                           "第 2 层"]
    assert b.get_title() == "前 2 个，原始分数"
    figure_text._compiled.cache_clear()


def test_log_axes_draw_their_minus_and_times_signs(chinese, caplog):
    fig, (ax, minor) = plt.subplots(1, 2)
    ax.loglog([1e-3, 1e3], [1e-5, 1e2])
    minor.semilogy([0, 1], [0.2, 0.7])     # under a decade: "6×10⁻¹" ticks
    with caplog.at_level(logging.WARNING, logger="matplotlib"):
        fig.canvas.draw()
    assert not caplog.records, [r.getMessage() for r in caplog.records]


def test_formatters_that_return_numbers_pass_through(chinese):
    class Numbers:                 # a formatter whose labels are not str
        def format_ticks(self, values):
            return list(values)
    f = Numbers()
    figure_text._translate_ticks(f, "zh")
    assert f.format_ticks([1, 2]) == [1, 2]
