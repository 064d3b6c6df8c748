"""Pins: the exact wording of course_lib.generation.sampling's error
messages. They keep messages from changing by accident; the behaviour
itself is specified in tests/test_sampling.py and tests/test_decoding.py.
"""
import pytest
import torch

from course_lib.generation import sampling
from course_lib.model.kv_cache import KVCache
from errors import whole_message
from tiny_lm_support import tiny_lm


def test_generate_cache_messages_in_full():
    lm, prompt = tiny_lm(), torch.randint(23, (2, 3))
    with pytest.raises(ValueError, match=whole_message(
            "max_len must be None when use_cache=True: a KV cache cannot "
            "crop its window")):
        sampling.generate(lm, prompt, 2, use_cache=True, max_len=8)
    with pytest.raises(TypeError, match=whole_message(
            "cache must be a KVCache or None, got list")):
        sampling.generate(lm, prompt, 2, use_cache=True, cache=[])
    cache = KVCache(2)
    sampling.generate(lm, prompt, 1, use_cache=True, cache=cache)
    with pytest.raises(ValueError, match=whole_message(
            "prompt_ids has batch size 3 but the cache holds batch size 2")):
        sampling.generate(lm, torch.randint(23, (3, 1)), 1, use_cache=True,
                          cache=cache)


def test_logits_messages_in_full():
    with pytest.raises(TypeError, match=whole_message(
            "logits must be a torch.Tensor, got list")):
        sampling.sample_next([1.0, 2.0])
    with pytest.raises(ValueError, match=whole_message(
            "logits must have shape (..., V) with V >= 1, got (2, 0)")):
        sampling.sample_next(torch.zeros(2, 0))
    with pytest.raises(ValueError, match=whole_message("logits must not contain NaN")):
        sampling.sample_next(torch.tensor([0.0, float("nan")]))
    with pytest.raises(ValueError, match=whole_message(
            "logits must not contain +inf (an overflow, e.g. a float16 "
            "model: run it in float32)")):
        sampling.sample_next(torch.tensor([0.0, float("inf")]))


def test_model_output_shape_message_in_full():
    class Wrong(torch.nn.Module):
        def forward(self, idx):
            return torch.zeros(idx.shape[0], 1, 5)

    with pytest.raises(ValueError, match=whole_message(
            "model must return logits of shape (B, T, V) = (2, 3, V), got "
            "(2, 1, 5)")):
        sampling.generate(Wrong(), torch.zeros(2, 3, dtype=torch.long), 1)
