"""Pins: the figure styling of course_lib.experiments.mask_probes's
draw_mask (colour maps, text colours, font sizes, grid). They keep the
figures from changing by accident; what is drawn is specified in
tests/test_masking.py.

Found by mutation testing (benchmarks/mutation.md, "Masking survivors
and why").
"""
import matplotlib
import torch

from course_lib.experiments import mask_probes
from test_masking import _filled

matplotlib.use("Agg")
from matplotlib.figure import Figure  # noqa: E402


def test_draw_mask_every_artist_by_hand():
    import numpy as np
    from matplotlib.colors import to_rgba
    nan = np.nan
    fig = Figure()
    # without weights: one image, blocked grey (0), allowed blue (1)
    ax = fig.add_subplot(121)
    mask = torch.tensor([[True, False, True], [True, True, False]])
    assert mask_probes.draw_mask(ax, mask) is ax
    (img,) = ax.images
    np.testing.assert_array_equal(_filled(img), [[1, 0, 1], [1, 1, 0]])
    assert img.get_clim() == (0, 1)
    assert img.get_cmap()(0.0) == to_rgba("#d9d9d9")
    assert img.get_cmap()(1.0) == to_rgba("#3b75af")
    assert not ax.texts and ax.get_title() == ""
    # default font size 8: tick labels 8, axis labels 9
    assert [t.get_text() for t in ax.get_xticklabels()] == ["0", "1", "2"]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["0", "1"]
    assert {t.get_fontsize() for t in ax.get_xticklabels()
            + ax.get_yticklabels()} == {8}
    assert (ax.get_xlabel(), ax.xaxis.label.get_fontsize()) == ("key", 9)
    assert (ax.get_ylabel(), ax.yaxis.label.get_fontsize()) == ("query", 9)

    # with weights and font size 5
    ax = fig.add_subplot(122)
    w = torch.tensor([[0.7, 0.0, 0.3], [0.6, 0.4, 0.0]], dtype=torch.float64)
    mask_probes.draw_mask(ax, mask, weights=w, title="T", fontsize=5,
                query_labels=["p", "q"], key_labels=["a", "b", "c"])
    shade, grey = ax.images
    np.testing.assert_array_equal(_filled(shade),
                                  [[0.7, nan, 0.3], [0.6, 0.4, nan]])
    assert shade.get_cmap().name == "Blues" and shade.get_clim() == (0, 1)
    np.testing.assert_array_equal(_filled(grey),
                                  [[nan, 1, nan], [nan, nan, 1]])
    assert grey.get_cmap()(1.0) == to_rgba("#d9d9d9")
    assert grey.get_clim() == (0, 1)
    # one centred label per cell; white only on weights above 0.6
    cells = [(t.get_position(), t.get_text(), t.get_color(), t.get_fontsize(),
              t.get_ha(), t.get_va()) for t in ax.texts]
    expected = []
    for i in range(2):
        for j in range(3):
            ok = bool(mask[i, j])
            text = f"{float(w[i, j]):.2f}" if ok else "-"
            colour = "white" if ok and w[i, j] > 0.6 else "black"
            expected.append(((j, i), text, colour, 5, "center", "center"))
    assert cells == expected
    assert (ax.get_title(), ax.title.get_fontsize()) == ("T", 7)
    assert ax.xaxis.label.get_fontsize() == ax.yaxis.label.get_fontsize() == 6
    assert [t.get_text() for t in ax.get_xticklabels()] == ["a", "b", "c"]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["p", "q"]
    assert {t.get_fontsize() for t in ax.get_xticklabels()
            + ax.get_yticklabels()} == {5}
    # major ticks on the cells, minor ticks (the grid) between them
    assert list(ax.get_xticks()) == [0, 1, 2]
    assert list(ax.get_yticks()) == [0, 1]
    assert list(ax.get_xticks(minor=True)) == [-0.5, 0.5, 1.5, 2.5]
    assert list(ax.get_yticks(minor=True)) == [-0.5, 0.5, 1.5]
    for axis in (ax.xaxis, ax.yaxis):
        for tick in axis.get_minor_ticks():
            assert tick.gridline.get_visible()
            assert tick.gridline.get_color() == "white"
            assert tick.gridline.get_linewidth() == 1
            assert tick.tick1line.get_markersize() == 0
        assert not any(t.gridline.get_visible()
                       for t in axis.get_major_ticks())


def test_draw_mask_all_allowed_is_blue_and_all_blocked_grey():
    # the colour scale is fixed to [0, 1]: a mask with one value only
    # must not be rescaled to its own range (which would draw it grey)
    from matplotlib.colors import to_rgba
    fig = Figure()
    for i, (value, colour) in enumerate(((True, "#3b75af"),
                                         (False, "#d9d9d9"))):
        ax = fig.add_subplot(1, 2, i + 1)
        mask_probes.draw_mask(ax, torch.full((2, 3), value))
        (img,) = ax.images
        assert img.get_clim() == (0, 1)
        assert img.get_cmap()(img.norm(float(value))) == to_rgba(colour)
