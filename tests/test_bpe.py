"""Tests for course_lib.pretrained.bpe (chapter 13), the pure-Python byte-level BPE.

References: a merge list worked by hand (closed form); tokenizers' own
pre-tokenizers (Digits + ByteLevel) for the word splitting and its
ByteLevel alphabet for the byte map; course_lib's fast tokenizer (Rust
BPE) for the ids on the test corpus.
"""
import pytest

from smollm2_support import needs_weights
from course_lib.pretrained.bpe import BPE, bytes_to_unicode, pretokenize
from test_tokenizer import CORPUS


def test_bytes_to_unicode():
    from tokenizers import pre_tokenizers
    table = bytes_to_unicode()
    assert len(table) == 256 and len(set(table.values())) == 256
    assert table[ord(" ")] == "Ġ" and table[ord("\n")] == "Ċ"
    assert table[ord("a")] == "a"
    assert set(table.values()) == set(pre_tokenizers.ByteLevel.alphabet())


def test_pretokenize_matches_tokenizers():
    from tokenizers import pre_tokenizers
    ref = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    byte = bytes_to_unicode()
    for text in CORPUS:
        ours = ["".join(byte[b] for b in w.encode("utf-8"))
                for w in pretokenize(text)]
        assert ours == [w for w, _ in ref.pre_tokenize_str(text)], text
    assert pretokenize("a12 b") == ["a", "1", "2", " b"]
    assert pretokenize("a12 b", split_digits=False) == ["a", "12", " b"]


def toy() -> BPE:
    tokens = ["<s>", "l", "o", "w", "e", "r", "Ġ", "lo", "low", "er",
              "Ġlow", "lower"]
    merges = ["l o", "lo w", "e r", "Ġ low", "low er"]
    return BPE(tokens, merges, special_tokens=["<s>"])


def test_merge_steps_by_hand():
    steps = toy().merge_steps("lower")
    assert steps == [["l", "o", "w", "e", "r"],     # bytes
                     ["lo", "w", "e", "r"],         # rank 0: l o
                     ["low", "e", "r"],             # rank 1: lo w
                     ["low", "er"],                 # rank 2: e r
                     ["lower"]]                     # rank 4: low er
    assert toy().merge_steps(" low") == [["Ġ", "l", "o", "w"],
                                         ["Ġ", "lo", "w"], ["Ġ", "low"],
                                         ["Ġlow"]]


def test_toy_encode_decode():
    b = toy()
    ids = b.encode("<s>lower low")
    assert [b.tokens[i] for i in ids] == ["<s>", "lower", "Ġlow"]
    assert b.decode(ids) == "<s>lower low"


def test_bad_input():
    b = toy()
    with pytest.raises(TypeError, match="text must be a str"):
        b.encode(None)
    with pytest.raises(ValueError, match="word must be a non-empty str"):
        b.merge_steps("")
    with pytest.raises(ValueError, match="ids must be a list of ints"):
        b.decode([99])
    with pytest.raises(ValueError, match="special_tokens must be in"):
        BPE(["a"], [], special_tokens=["<x>"])
    with pytest.raises(TypeError, match="text must be a str"):
        pretokenize(3)
    # the string 'False' is truthy: it would split the digits
    with pytest.raises(TypeError, match="split_digits must be a bool"):
        pretokenize("abc 12345", split_digits="False")
    with pytest.raises(TypeError, match="split_digits must be a bool"):
        BPE(["a"], [], split_digits="False")


@pytest.fixture(scope="module")
def both():
    from course_lib.pretrained.smollm2 import open_smollm2
    from course_lib.pretrained.tokenizer import ByteLevelBPETokenizer
    md = open_smollm2().metadata
    fast = ByteLevelBPETokenizer.from_gguf(md)
    slow = BPE(md["tokenizer.ggml.tokens"], md["tokenizer.ggml.merges"],
               special_tokens=fast.special_tokens)
    return slow, fast


@needs_weights
@pytest.mark.parametrize("text", CORPUS)
def test_teaching_bpe_equals_fast_tokenizer(both, text):
    slow, fast = both
    ids = slow.encode(text)
    assert ids == fast.encode(text)
    assert slow.decode(ids) == text


@needs_weights
def test_merge_steps_on_the_real_vocabulary(both):
    slow, _ = both
    steps = slow.merge_steps(" tokenization")
    assert steps[0] == list("Ġtokenization")
    assert all(len(b) == len(a) - 1 for a, b in zip(steps, steps[1:]))
    assert all(t in slow.vocab for t in steps[-1])
    assert len(steps[-1]) < len(steps[0])
