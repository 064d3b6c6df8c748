"""The rule that decides which words of a Chinese page are English a
reader should not meet (``zh_scan``), on made-up texts: what it spares
and what it still finds."""
from zh_scan import english_words, raw_tex


def bad(text, names=()):
    return english_words(text, set(names))


def test_names_in_chinese_text_are_spared_but_not_alone():
    # a capitalised word in Chinese prose is a name; alone it is a label
    assert bad("把 Elman 递推式用 Adam 训练") == []
    assert bad("Check") == ["Check"]
    # an identifier of the page's code beside its Chinese name, not alone
    assert bad("底数 base", {"base"}) == [] and bad("base", {"base"}) == [
        "base"]
    # a lower-case English word in Chinese prose is found
    assert bad("这个 bucket 装不下", {"base"}) == ["bucket"]


def test_glosses_titles_and_quoted_strings_are_spared():
    assert bad("（attention sink，第 13 章会测量它）") == []
    assert bad("外推（length extrapolation，见其第一张图）") == []
    # a parenthesis is a gloss, not a place for a sentence left in English
    assert bad("（this sentence was never translated into Chinese，第 2 章）"
               ) == ["this", "sentence", "was", "never", "translated",
                     "into"]
    assert bad("一篇再分析《Turning Down the Heat: A Critical Analysis》") == []
    assert bad("字符 'expression1: raise AssertionError(expression2)' 上") == []
    # outside those marks the same words are found
    assert bad("一篇再分析 Turning Down the Heat") == ["the"]


def test_plain_text_formulas_and_maths_functions_are_spared():
    assert bad("概率是 Σ_v min(p_v, q_v)，位置 p 存放在 table[p]") == []
    assert bad("以 (1 − ε)·one-hot + ε/V 为目标") == []
    assert bad("编码表 PE(pos, 2i) = sin(pos·ω_i)") == []
    assert bad("PE(pos, 2i)") == ["pos"]         # no Chinese: no formula
    # the same word not touching a maths sign is found
    assert bad("一个 table 里") == ["table"]


def test_terms_the_glossary_keeps_in_english_may_start_a_heading():
    assert bad("Top-k") == [] and bad("Softmax 温度") == []
    assert bad("Causal") == ["Causal"]


def test_tex_shown_as_typed_is_found():
    assert raw_tex("第 3 章“L \\times L 的开销”一节") == ["\\times"]
    assert raw_tex("缩放 \\(\\sqrt{d_k}\\) 与 $\\alpha$") == []
