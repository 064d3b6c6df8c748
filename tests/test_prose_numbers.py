"""No chapter states a number its own outputs contradict.

The two rules are in ``prose_numbers.py``: glued numbers must equal what
the notebook glued, and every other informative decimal in the prose
must be shown by an output or have its source listed in
``prose_numbers_sources.toml``. The first tests reproduce the cells the
reviews of 2026-12-05 found drifting, to show the rules catch them.
"""
from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
from IPython.core.interactiveshell import InteractiveShell

import prose_numbers as pn
from course_lib.notebook.glue import GLUE_MIME, fill_glue, glue, glued_values

ROOT = Path(__file__).resolve().parents[1]
ENGLISH = sorted((ROOT / "book").glob("ch*.ipynb"))
NOTEBOOKS = ENGLISH + sorted((ROOT / "zh" / "book").glob("ch*.ipynb"))


def _notebook(*cells) -> dict:
    """A notebook of ``("md", text)`` and ``("out", text)`` cells."""
    out = []
    for kind, text in cells:
        if kind == "md":
            out.append({"cell_type": "markdown", "source": text})
        else:
            out.append({"cell_type": "code", "source": "",
                        "outputs": [{"output_type": "stream",
                                     "name": "stdout", "text": text}]})
    return {"cells": out}


def _glued(name: str, text: str) -> dict:
    return {"cell_type": "code", "source": "", "outputs": [{
        "output_type": "display_data", "data": {GLUE_MIME: text},
        "metadata": {"scrapbook": {"name": name}}}]}


# The per-seed table of chapter 5 as the review read it, and its sentence.
CH05_TABLE = """heads  d_k    mean     min     max   per seed
    1   32   2.560   2.544   2.569   2.544 2.569 2.566
    4    8   2.493   2.466   2.513   2.466 2.513 2.499
"""


def test_a_hand_typed_difference_the_table_does_not_show_is_caught():
    nb = _notebook(("out", CH05_TABLE), ("md", (
        "Four heads lower the mean validation loss by 0.067 nats per "
        "character against one head, and they do so with every seed "
        "(by 0.057 to 0.077).")))
    assert pn.unsourced_numbers(nb, {}) == [(1, "0.067"), (1, "0.057"),
                                            (1, "0.077")]


def test_the_same_sentence_with_glued_numbers_passes_and_catches_drift():
    sentence = ("with every seed (by <!--glue:gap_min-->0.056<!--/glue--> "
                "to <!--glue:gap_max-->0.078<!--/glue-->)")
    nb = _notebook(("out", CH05_TABLE), ("md", sentence))
    nb["cells"] += [_glued("gap_min", "0.056"), _glued("gap_max", "0.078")]
    assert pn.unsourced_numbers(nb, {}) == []
    assert pn.glue_problems(nb) == []
    nb["cells"][-1] = _glued("gap_max", "0.077")     # the code changed
    assert pn.glue_problems(nb) == [
        "cell 1: the prose says '0.078' where the output of 'gap_max' is "
        "'0.077'"]
    assert fill_glue(nb) == []                        # run_notebooks' step
    assert pn.glue_problems(nb) == []
    assert "to <!--glue:gap_max-->0.077<!--/glue-->)" in \
        nb["cells"][1]["source"]


def test_a_marker_at_the_start_of_a_line_is_caught():
    # CommonMark starts an HTML block at a line beginning with "<!--", so
    # the sentence would break into two paragraphs in the book
    split = "The MoE took\n  <!--glue:r-->1.87<!--/glue--> times as long."
    nb = _notebook(("md", split))
    nb["cells"].append(_glued("r", "1.87"))
    assert "splits the paragraph" in " ".join(pn.glue_problems(nb))
    nb["cells"][0]["source"] = split.replace("\n  ", " ")
    assert pn.glue_problems(nb) == []


def test_a_glue_name_no_cell_records_is_caught():
    nb = _notebook(("md", "a gap of <!--glue:gap-->0.1<!--/glue-->"))
    assert pn.glue_problems(nb) == [
        "cell 0: glue name 'gap' is not recorded by any cell"]
    assert fill_glue(nb) == ["gap"]


def test_a_number_shown_at_more_precision_or_in_other_units_passes():
    nb = _notebook(("out", "loss 2.3412, 63,082,368 parameters, 0.125\n"),
                   ("md", "The loss is 2.34 with 63.1M parameters, "
                          "12.5 % more; it is not 2.35."))
    assert pn.unsourced_numbers(nb, {}) == [(1, "2.35")]
    assert pn.unsourced_numbers(nb, {"2.35": "a typo kept on purpose"}) \
        == []


def test_math_code_citations_and_short_decimals_are_not_checked():
    nb = _notebook(("md", "Take $p = 0.123$ and `x = 4.567`; the paper "
                          "reports 25.8 BLEU {cite:p}`vaswani2017attention`."
                          " A ratio of 0.5 or 3.4 is not informative."))
    assert pn.unsourced_numbers(nb, {}) == []


def test_glue_records_a_hidden_value_that_myst_nb_reads():
    shell = InteractiveShell.instance()
    shown = []
    shell.display_pub.publish = (
        lambda data, metadata=None, **kw: shown.append((data, metadata)))
    try:
        assert glue("ratio", 2 / 3, ".3f") is None      # no Out[] line
    finally:
        InteractiveShell.clear_instance()
    [(data, metadata)] = shown
    assert data == {GLUE_MIME: "0.667"}                # no text/plain
    assert metadata["scrapbook"] == {
        "name": "ratio", "mime_prefix": "application/papermill.record/"}
    nb = {"cells": [{"cell_type": "code", "source": "", "outputs": [{
        "output_type": "display_data", "data": data,
        "metadata": metadata}]}]}
    assert glued_values(nb) == {"ratio": "0.667"}


@pytest.mark.parametrize("name, fmt, error, argument", [
    ("2nd", "", ValueError, "name"), ("a-b", "", ValueError, "name"),
    (3, "", TypeError, "name"), ("x", 3, TypeError, "fmt")])
def test_glue_refuses_a_bad_name_or_format(name, fmt, error, argument):
    with pytest.raises(error, match=argument):
        glue(name, 1.0, fmt)


def test_every_listed_source_names_a_chapter_and_gives_a_reason():
    table = tomllib.loads(pn.SOURCES.read_text(encoding="utf-8"))
    stems = {p.stem for p in NOTEBOOKS}
    for stem, entries in table.items():
        assert stem in stems, f"{stem}: no such chapter"
        for number, reason in entries.items():
            assert len(reason.split()) >= 3, f"{stem} {number}: say why"


@pytest.mark.parametrize("path", NOTEBOOKS,
                         ids=lambda p: ("zh/" if "zh" in p.parts else "") + p.stem)
def test_prose_numbers_match_the_outputs(path):
    nb = json.loads(path.read_text(encoding="utf-8"))
    problems = pn.glue_problems(nb) + [
        f"cell {i}: {number} is shown by no output and has no listed "
        f"source" for i, number in
        pn.unsourced_numbers(nb, pn.listed_sources(path.stem))]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("path", ENGLISH, ids=lambda p: p.stem)
def test_every_glued_value_is_used_by_the_prose(path):
    nb = json.loads(path.read_text(encoding="utf-8"))
    prose = "".join("".join(c["source"]) for c in nb["cells"]
                    if c["cell_type"] == "markdown")
    unused = [n for n in glued_values(nb) if f"<!--glue:{n}-->" not in prose]
    assert not unused, f"glued but never quoted: {unused}"
