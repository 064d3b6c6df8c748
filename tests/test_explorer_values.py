"""Explorer controls and the chat box in the reader's language.

An explorer's control labels and the labels of its word-valued options
go through ``tr()``; the frames stay keyed by the raw values. The chat
box (chapter 13) shows its placeholder, button, transcript and static
note through ``tr()`` too. ``reader_strings`` extracts the value labels,
so the translation checks require their Chinese.
"""
import html
import importlib.util
import json
import re
from pathlib import Path

import pytest

from course_lib.notebook.chat import ChatBox
from course_lib.notebook.i18n import catalog, set_language
from course_lib.notebook.widgets import Explorer

ROOT = Path(__file__).resolve().parents[1]


def draw(fig, *, norm, depth):
    fig.add_subplot().plot([0, depth], [0, {"none": 1, "pre": 2}[norm]])


def explorer(**kw):
    return Explorer(key="t-values", title="Norm", draw=draw,
                    controls={"norm": ["none", "pre"], "depth": [8, 16]},
                    initial={"norm": "pre", "depth": 8},
                    labels={"norm": "normalisation", "depth": "depth N"},
                    value_labels={"norm": {"none": "none",
                                           "pre": "pre-norm"}},
                    figsize=(3, 2), dpi=30, **kw)


def controls_of(page):
    """Per slider: (label, shown values, aria-label, aria-valuetext,
    read-out)."""
    found = re.findall(
        r'<label class="ti-control"[^>]*>(.*?) <input .*?'
        r"data-values='([^']*)' aria-label=\"([^\"]*)\" "
        r'aria-valuetext="([^"]*)"> <output>([^<]*)</output>', page)
    return [(html.unescape(label), json.loads(html.unescape(values)),
             html.unescape(aria), html.unescape(now), html.unescape(out))
            for label, values, aria, now, out in found]


@pytest.fixture
def zh(monkeypatch):
    for en, text in {"normalisation": "归一化", "depth N": "深度 N",
                     "none": "无", "pre-norm": "前归一化"}.items():
        monkeypatch.setitem(catalog("zh"), en, text)
    set_language("zh")
    yield
    set_language("en")


def test_value_labels_show_in_both_views_and_frames_stay_keyed_by_value():
    ex = explorer()
    assert controls_of(ex.static_html()) == [
        ("normalisation", ["none", "pre-norm"], "normalisation",
         "pre-norm", "pre-norm"),
        ("depth N", ["8", "16"], "depth N", "8", "8")]
    ex.widget()
    slider = ex.sliders["norm"]
    assert [label for label, _ in slider.options] == ["none", "pre-norm"]
    assert slider.value == "pre" and slider.description == "normalisation"
    slider.value = "none"                               # raw value
    assert ex.image.value == ex.png(norm="none", depth=8)


def test_value_labels_and_labels_in_chinese(zh):
    ex = explorer()
    page = ex.static_html()
    assert controls_of(page) == [
        ("归一化", ["无", "前归一化"], "归一化", "前归一化", "前归一化"),
        ("深度 N", ["8", "16"], "深度 N", "8", "8")]
    ex.widget()
    # the live widget shows what the static player shows
    for name, (label, shown, *_) in zip(ex.sliders, controls_of(page)):
        assert ex.sliders[name].description == label
        assert [text for text, _ in ex.sliders[name].options] == shown
    assert ex.shown("norm", "none") == "无" and ex.shown("depth", 16) == "16"


@pytest.mark.parametrize("kwargs, error, needle", [
    (dict(labels={"width": "w"}), ValueError,
     r"labels names unknown controls \['width'\]"),
    (dict(value_labels={"width": {1: "one"}}), ValueError,
     r"value_labels names unknown controls \['width'\]"),
    (dict(value_labels={"a": {"x": "ex", 3: "three"}}), ValueError,
     r"value_labels\['a'\] names \[3\], not values of the control"),
    (dict(value_labels={"a": {"x": 1}}), TypeError,
     r"value_labels\['a'\] must be str texts"),
    (dict(labels={"a": 1}), TypeError, "labels must be a dict of str"),
])
def test_bad_labels_name_the_argument(kwargs, error, needle):
    with pytest.raises(error, match=needle):
        Explorer(key="t-bad", title="t", draw=draw,
                 controls={"a": ["x", "y"]}, **kwargs)


def _zt():
    spec = importlib.util.spec_from_file_location(
        "zh_translations", ROOT / "scripts" / "zh_translations.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_reader_strings_extract_labels_and_value_labels(tmp_path):
    source = ('Explorer(key="t", title="Norm", draw=draw,\n'
              '         controls={"norm": NORMS, "depth": [8, 16]},\n'
              '         labels={"norm": "normalisation"},\n'
              '         value_labels={"norm": {"none": "no norm",\n'
              '                                "pre": "pre-norm"}})')
    nb = tmp_path / "ch99_toy.ipynb"
    nb.write_text(json.dumps({"cells": [
        {"cell_type": "code", "id": "c", "metadata": {}, "outputs": [],
         "execution_count": None, "source": source}],
        "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    # the texts, not the control names or the raw values (dict keys)
    assert _zt().reader_strings(nb) == ["Norm", "normalisation", "no norm",
                                        "pre-norm"]


# -- the chat box -------------------------------------------------------
def test_chat_box_sends_the_question_and_ignores_a_blank_one(capsys):
    asked = []
    box = ChatBox(lambda q: (asked.append(q), print("Paris.")))
    box.widget()
    box.text.value = "  Capital of France?  "
    box.button.click()
    box.send("   ")
    assert asked == ["Capital of France?"] and box.text.value == ""
    # outside a kernel the transcript prints where print() goes
    assert capsys.readouterr().out == \
        "you: Capital of France?\nSmolLM2: Paris.\n"
    bundle = box._repr_mimebundle_()
    assert "needs a running Python kernel" in bundle["text/html"]
    assert bundle["text/plain"] == "SmolLM2 chat box"   # as the English


def test_chat_box_in_chinese():
    set_language("zh")
    try:
        box = ChatBox(print)
        box.widget()
        assert box.text.placeholder == "向 SmolLM2 提一个问题"
        assert box.button.description == "发送"
        assert box.static_html() == (
            '<p class="ti-chat-note"><em>聊天框需要一个运行中的 Python '
            '内核：请在 Colab（页面顶部的按钮）或 Jupyter 中打开本章。'
            '</em></p>')
    finally:
        set_language("en")


@pytest.mark.parametrize("kwargs, error", [
    (dict(ask="ask"), TypeError), (dict(ask=print, name=3), TypeError)])
def test_chat_box_rejects_bad_arguments(kwargs, error):
    with pytest.raises(error, match="ask must be callable|name must be"):
        ChatBox(**kwargs)
