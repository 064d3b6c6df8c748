"""Pins: the exact wording of error messages of
course_lib.generation.decoding (and of sampling.generate with a cache).
They keep messages from changing by accident; the behaviour itself is
specified in tests/test_decoding.py.

Found by mutation testing (benchmarks/mutation.md, "Decoding survivors
and why"): a mutant that changes only a message is killed here, so
`make mutation` runs this file with the behaviour tests ([tool.mutmut]
in pyproject.toml).
"""
import pytest
import torch

from course_lib.generation import decoding
from errors import whole_message
from test_decoding import IdClock, generate, tiny_lm


def test_decode_throughput_bad_input_messages():
    rec = IdClock(None)
    for name in ("prompt_len", "new_tokens", "repeats", "batch_size"):
        kw = dict(prompt_len=2, new_tokens=2, repeats=1, batch_size=1)
        kw[name] = 0
        with pytest.raises(ValueError, match=rf"^{name} must be >= 1, got 0$"):
            decoding.decode_throughput(rec, use_cache=True, **kw)


def test_model_config_message_names_the_model():
    with pytest.raises(ValueError, match=r"^model must have a config with "
                       r"num_hidden_layers and max_position_embeddings "
                       r"\(e\.g\. a DecoderLM\) to use a cache, got "
                       r"Identity$"):
        generate(torch.nn.Identity(), torch.tensor([1, 2]), 2)


def test_decode_throughput_flag_and_size_messages_in_full():
    lm = tiny_lm()
    with pytest.raises(TypeError, match=whole_message(
            "use_cache must be a bool, got str 'yes'")):
        decoding.decode_throughput(lm, prompt_len=2, new_tokens=2,
                                   use_cache="yes")
    with pytest.raises(ValueError, match=r"^batch_size \* \(prompt_len \+ "
                       r"new_tokens\) \* vocab_size asks for "):
        decoding.decode_throughput(lm, prompt_len=4, new_tokens=10**9,
                                   use_cache=True)
