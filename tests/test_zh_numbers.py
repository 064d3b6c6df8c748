"""One style for the large numbers of each chapter's Chinese prose.

A quantity written in the prose (parameters, tokens, bytes, FLOPs, ...)
can be written in Chinese units, ``1.35 亿``, ``4150 万``, or with a Latin
suffix, ``135M``, ``41.5M``, ``671B``. Either reads well; both in one
chapter do not ("1.35 亿参数" a few lines from "135M" makes the reader
convert between them). Each chapter of the Chinese edition therefore keeps to one
style in its Chinese cells (``course_lib/notebook/locale/zh/<chapter>.json``,
``cells``); the test below names the chapter, the cells and the forms of
both styles when one mixes them.

What counts:

* a Chinese-unit quantity is a number written in digits followed by
  万 or 亿 (``5.4 万``, ``6710 亿``, ``11 万亿``); a number in Chinese
  numerals ("数十亿", "约十亿") is a round figure of speech, not a
  written quantity, and does not count;
* a Latin quantity is a number followed at once by M, B, K (or k) or T
  (``65M``, ``7B``, ``160K``, ``1T``), with no letter or digit after it
  (``KiB``, ``MiB`` are byte units, and ``E4M3`` is a format's name).
  A formula that ends in a digit stands for a number here too, so
  ``$\\approx 44$M`` is a Latin quantity.

What does not count, because it is a name or is not the prose's own
wording (see :func:`quantities`, each exemption commented there).

The calque that writes 百万/千万 as a unit ("9.5 百万") is a third,
wrong style; ``tests/test_zh_terms.py::test_no_million_calque`` fails
on it in every chapter, so this file does not repeat that check.
"""
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ZH = ROOT / "course_lib" / "notebook" / "locale" / "zh"
CHAPTERS = sorted(ZH.glob("ch*.json"))

# Blanked out before the search, each with its reason:
_BLANK = re.compile(
    # code spans (and role bodies): identifiers and printed output, which
    # are the code's, not the prose's
    r"`[^`]*`"
    # glue markers with their value: the value is the English notebook's
    # output, written by the code, and cannot change
    r"|<!--glue:[^>]*-->.*?<!--/glue-->"
    # a phrase in quotation marks: a name ("“7B”", "“124M”") or a
    # published text quoted as it was written
    r"|“[^“”]*”"
    # display maths: formulas, not prose
    r"|\$\$.*?\$\$", re.S)
_INLINE_MATH = re.compile(r"\$([^$\n]+)\$")
_MATH_END = re.compile(r"(?<![\d.])(\d+(?:\.\d+)?)\s*$")
# a number starts after no letter, digit, point, comma or hyphen: a
# number glued to a name is part of the name (SmolLM2-135M, Llama-2-7B,
# Mixtral-8x7B, OLMoE-1B-7B, Qwen3-30B-A3B, E4M3, Kimi K2), and a point
# or comma before a digit is the middle of a number
_START = r"(?<![A-Za-z0-9_.,\-])"
_NUMBER = r"\d+(?:[.,]\d+)*"
_CHINESE = re.compile(_START + _NUMBER + r"\s*[万亿]")
# (a thousand is written K or k: "160K", "4k")
_LATIN = re.compile(_START + _NUMBER + r"[MBKkT](?![A-Za-z0-9])")
# a model name whose size follows a space: "Mistral 7B", "Llama 2 70B"
_NAME_BEFORE = re.compile(r"[A-Z][A-Za-z]*(?: \d+)? $")


def _power_of_two(n: str) -> bool:
    return n.isdigit() and int(n) >= 2 and int(n) & (int(n) - 1) == 0


def quantities(text: str) -> tuple[list[str], list[str]]:
    """``(Chinese-unit forms, Latin-suffix forms)`` of the quantities in
    ``text``'s prose, in order of appearance."""
    plain = _BLANK.sub(" ", text)
    # inline maths is blanked too, but one that ends in a number stands
    # for that number and may carry a unit after it ("$9.5$ 万",
    # "$\\approx 44$M" -> "44M")
    plain = _INLINE_MATH.sub(
        lambda m: " " + (_MATH_END.findall(m.group(1)) or [""])[0], plain)
    chinese = [m.group() for m in _CHINESE.finditer(plain)]
    latin = []
    for m in _LATIN.finditer(plain):
        number, suffix = m.group()[:-1], m.group()[-1]
        if _NAME_BEFORE.search(plain[:m.start()]):
            continue            # a model's name: Mistral 7B, Llama 2 70B
        if suffix in "Kk" and _power_of_two(number):
            # a context length's name, not a count: the context windows
            # are powers of two (4K, 32K, 128K, "128k 词元"); 160K is not
            continue
        latin.append(m.group())
    return chinese, latin


def mixed(cells: dict[str, str]) -> str:
    """An empty string when the texts ``{cell id: text}`` keep to one
    style, else a message naming each style's forms and their cells."""
    found = {"Chinese units": [], "Latin suffixes": []}
    for cid, text in cells.items():
        chinese, latin = quantities(text)
        found["Chinese units"] += [f"{q} ({cid})" for q in chinese]
        found["Latin suffixes"] += [f"{q} ({cid})" for q in latin]
    if not all(found.values()):
        return ""
    # every form of the rarer style (the ones to rewrite, usually), the
    # first few of the other
    rarer = min(found, key=lambda style: len(found[style]))
    return "; ".join(
        f"{style} ({len(forms)}): " + ", ".join(
            forms if style == rarer or len(forms) <= 6
            else forms[:6] + ["..."])
        for style, forms in found.items())


def chinese_cells(path: Path) -> dict[str, str]:
    return {cid: entry["zh"] for cid, entry in
            json.loads(path.read_text(encoding="utf-8"))["cells"].items()
            if entry.get("zh")}


# ------------------------------------------------ the check on made-up text
def test_quantities_on_made_up_text():
    assert quantities("约 5.4 万个位置，6710 亿参数，11 万亿词元") == (
        ["5.4 万", "6710 亿", "11 万"], [])
    assert quantities("共 63.1M 个参数，671B 总参数，160K 个位置，50k 个词元，"
                      "1.026T，$\\approx 44$M 个参数") == (
        [], ["63.1M", "671B", "160K", "50k", "1.026T", "44M"])
    # names, code, glued output, quotations, maths, units and Chinese
    # numerals are not quantities of either style
    assert quantities(
        "SmolLM2-135M、Llama-2-70B、Mixtral-8x7B、OLMoE-1B-7B、Mistral 7B、"
        "Llama 2 70B、Kimi K2、E4M3；上下文 4K 到 128K、4k 和 128k；"
        "输出 `135.0M` 与 <!--glue:n-->41.5M<!--/glue-->；"
        "公布的“7B”和“37B 稠密模型”；"
        "$2.6 \\cdot 10^6$ 个位置，$h/G$ 倍；68.6 KiB、12 GB；数十亿参数"
    ) == ([], [])


def test_mixed_passes_one_style_and_names_both_when_mixed():
    chinese = {"a": "一个 1.35 亿参数的模型", "b": "嵌入有 2800 万个权重"}
    latin = {"a": "一个 135M 参数的模型", "b": "嵌入有 28M 个权重"}
    names = {"c": "SmolLM2-135M 与 Mistral 7B，上下文 128K"}
    assert mixed(chinese) == "" and mixed(latin) == ""
    assert mixed({**chinese, **names}) == ""
    assert mixed({**latin, **names}) == ""
    assert mixed({"a": chinese["a"], "b": latin["b"]}) == (
        "Chinese units (1): 1.35 亿 (a); Latin suffixes (1): 28M (b)")


def test_a_mutant_of_a_real_chapter_is_caught():
    # chapter 7 writes SmolLM2's size as 1.35 亿; the same sentence with
    # 135M, as it once read, mixes the styles
    cells = chinese_cells(ZH / "ch07_training.json")
    assert mixed(cells) == ""
    cid = next(c for c, t in cells.items() if "1.35 亿" in t)
    mutant = {**cells, cid: cells[cid].replace("1.35 亿", "135M", 1)}
    assert mixed(mutant).endswith(f"Latin suffixes (1): 135M ({cid})")


# --------------------------------------------------------- the whole book
@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem[:4])
def test_each_chapter_keeps_one_number_style(path):
    message = mixed(chinese_cells(path))
    assert message == "", (
        f"{path.stem} mixes the two styles of large numbers; keep the one "
        f"most of its quantities use (the Latin one where it quotes "
        f"glued or printed M/B values): {message}")
