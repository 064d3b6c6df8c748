"""Tests for course_lib.pretrained.tokenizer (chapter 13): the fast byte-level BPE
tokenizer and chat template built from the SmolLM2 GGUF file.

References: tokenizers' own pre-tokenizers and the vocabulary of the
file (special tokens are single ids; decode inverts encode); the
template in the file rendered by hand for one conversation. transformers'
tokenizer is the reference in test_pretrained_reference.py.
"""
import pytest

from smollm2_support import needs_weights
from course_lib.pretrained.tokenizer import ByteLevelBPETokenizer

# English, Python, digits, whitespace runs (spaces, tabs, newlines, also
# before digits), Chinese, emoji, special tokens, contractions, accents.
CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Transformers read text as tokens; a tokenizer decides what they are.",
    "def fib(n):\n    if n < 2:\n        return n\n"
    "    return fib(n - 1) + fib(n - 2)\n",
    "for i in range(10):\n\tprint(f\"{i:>4d}\", end='')  # tab-indented\n",
    "12345 3.14159 2024-06-30 1,000,000 0x1F $9.99 (42) x=-7",
    "a  3\tb\t\t17\n\n\n  99   1000",
    "    leading spaces, trailing spaces    ",
    "\n\n\nblank lines\r\n windows line end",
    "你好，世界！机器学习很有趣。",
    "Emoji: 😀👍🏽🇫🇷 and ❤️ done",
    "<|im_start|>user\nhi<|im_end|>",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>assistant\n",
    "I'm sure they'll say it's fine, we've seen it, you'd agree.",
    "Café naïve façade résumé Ünïcödé ß",
    "",
]


@pytest.fixture(scope="module")
def tok():
    from course_lib.pretrained.smollm2 import open_smollm2
    return ByteLevelBPETokenizer.from_gguf(open_smollm2().metadata)


@needs_weights
def test_ids_and_sizes(tok):
    assert tok.vocab_size == 49152
    assert (tok.bos_id, tok.eos_id, tok.pad_id, tok.unk_id) == (1, 2, 2, 0)
    assert tok.tokens[tok.bos_id] == "<|im_start|>"
    assert tok.tokens[tok.eos_id] == "<|im_end|>"
    assert len(tok.special_tokens) == 17


@needs_weights
def test_special_tokens_are_single_ids(tok):
    for i, t in enumerate(tok.tokens[:17]):
        assert tok.encode(t) == [i]
    ids = tok.encode("<|im_start|>user\nhi<|im_end|>")
    assert ids[0] == tok.bos_id and ids[-1] == tok.eos_id
    assert tok.decode(ids) == "<|im_start|>user\nhi<|im_end|>"


@needs_weights
@pytest.mark.parametrize("text", CORPUS)
def test_decode_inverts_encode(tok, text):
    ids = tok.encode(text)
    assert all(0 <= i < tok.vocab_size for i in ids)
    assert tok.decode(ids) == text


@needs_weights
def test_digits_are_single_tokens(tok):
    ids = tok.encode("2024")
    assert [tok.tokens[i] for i in ids] == ["2", "0", "2", "4"]
    # SmolLM2's pre-tokenizer isolates digits before the GPT-2 regex, so
    # the two spaces before a digit stay together ("ĠĠ" is one token).
    assert [tok.tokens[i] for i in tok.encode("a  3")] == ["a", "ĠĠ", "3"]


@needs_weights
def test_pre_tokenizer_is_digits_then_byte_level(tok):
    from tokenizers import pre_tokenizers
    ref = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    for text in CORPUS:
        assert tok.backend.pre_tokenizer.pre_tokenize_str(text) == \
            ref.pre_tokenize_str(text)


@needs_weights
def test_chat_template(tok):
    msgs = [{"role": "user", "content": "What is 2 + 2?"}]
    system = ("<|im_start|>system\nYou are a helpful AI assistant named "
              "SmolLM, trained by Hugging Face<|im_end|>\n")
    assert tok.apply_chat_template(msgs) == (
        system + "<|im_start|>user\nWhat is 2 + 2?<|im_end|>\n"
        "<|im_start|>assistant\n")
    own = [{"role": "system", "content": "Be brief."}] + msgs
    text = tok.apply_chat_template(own, add_generation_prompt=False)
    assert text == ("<|im_start|>system\nBe brief.<|im_end|>\n"
                    "<|im_start|>user\nWhat is 2 + 2?<|im_end|>\n")


@needs_weights
def test_bad_input(tok):
    with pytest.raises(TypeError, match="text must be a str"):
        tok.encode(b"bytes")
    with pytest.raises(ValueError, match="ids must be a list of ints"):
        tok.decode([0, 49152])
    with pytest.raises(ValueError, match="messages must be a list"):
        tok.apply_chat_template([{"role": "user"}])
    with pytest.raises(ValueError, match="tokenizer.ggml.model='gpt2'"):
        ByteLevelBPETokenizer.from_gguf({"tokenizer.ggml.model": "llama"})
    with pytest.raises(ValueError, match="token_types must be a list of 2"):
        ByteLevelBPETokenizer(tokens=["a", "b"], merges=[], token_types=[1])
    with pytest.raises(ValueError, match="eos_id must be in"):
        ByteLevelBPETokenizer(tokens=["a", "b"], merges=[],
                              token_types=[1, 1], eos_id=5)
