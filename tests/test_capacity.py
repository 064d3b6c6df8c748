"""Tests for course_lib.sizing.capacity (chapter 9): hand-computed
capacities of published models, and the two quantities the count rests
on (weight bytes, cache bytes per token) measured on built models."""
import dataclasses

import pytest
import torch

from course_lib.model.kv_cache import KVCache
from course_lib.sizing.capacity import Capacity, kv_cache_capacity
from course_lib.sizing.configs import DEEPSEEK_V3, LLAMA2_7B, SMOLLM2_135M
from course_lib.sizing.from_config import build_small_model
from course_lib.sizing.params import num_parameters
from errors import error_for

GiB = 2 ** 30


def test_llama2_7b_on_one_80_gib_device_by_hand():
    # 6,738,415,616 parameters x 2 bytes; 2 (K, V) x 32 heads x 128 x 32
    # layers x 2 bytes = 524,288 bytes = 512 KiB per token
    weights = 6_738_415_616 * 2                       # 13.48 GB
    per_token = 2 * 32 * 128 * 32 * 2
    budget = 0.9 * 80 * GiB - weights                 # 63.83 GB
    cap = kv_cache_capacity(LLAMA2_7B, device_bytes=80 * GiB,
                            bytes_per_param=2, bytes_per_value=2,
                            context_len=4096)
    assert isinstance(cap, Capacity)
    assert cap.weights_bytes == weights
    assert cap.kv_bytes_per_token == per_token == 512 * 2 ** 10
    assert cap.kv_budget_bytes == pytest.approx(budget)
    assert cap.max_tokens == 121_750 == int(budget // per_token)
    assert cap.max_sequences == 29                    # 121,750 / 4,096
    # all of a decimal 80 GB device: "about 130k tokens"
    full = kv_cache_capacity(LLAMA2_7B, device_bytes=80e9,
                             bytes_per_param=2, bytes_per_value=2,
                             context_len=32768, gpu_memory_utilization=1.0)
    assert full.max_tokens == (80_000_000_000 - weights) // per_token \
        == 126_882
    assert full.max_sequences == 3


def test_deepseek_v3_mla_fp8_needs_more_than_8_devices():
    # MLA caches d_c + d_R = 512 + 64 values per layer, 61 layers
    per_token = (512 + 64) * 61 * 2                   # bf16 cache
    kw = dict(device_bytes=80 * GiB, bytes_per_param=1, bytes_per_value=2,
              context_len=32768)
    eight = kv_cache_capacity(DEEPSEEK_V3, n_devices=8, **kw)
    assert eight.weights_bytes == 671_026_404_352     # > 0.9 x 640 GiB
    assert (eight.kv_budget_bytes, eight.max_tokens,
            eight.max_sequences) == (0.0, 0, 0)
    sixteen = kv_cache_capacity(DEEPSEEK_V3, n_devices=16, **kw)
    budget = 0.9 * 16 * 80 * GiB - 671_026_404_352
    assert sixteen.kv_bytes_per_token == per_token == 70_272
    assert sixteen.max_tokens == int(budget // per_token)
    assert sixteen.max_sequences == sixteen.max_tokens // 32768


def test_monotone_in_devices_utilisation_and_cache_bytes():
    base = dict(device_bytes=24 * GiB, bytes_per_param=2, bytes_per_value=2,
                context_len=8192)
    tokens = [kv_cache_capacity(SMOLLM2_135M, n_devices=n, **base)
              .max_tokens for n in (1, 2, 4)]
    assert tokens[0] < tokens[1] < tokens[2]
    fp8 = kv_cache_capacity(SMOLLM2_135M, **base | dict(bytes_per_value=1))
    bf16 = kv_cache_capacity(SMOLLM2_135M, **base)
    assert fp8.max_tokens in (2 * bf16.max_tokens, 2 * bf16.max_tokens + 1)
    low = kv_cache_capacity(SMOLLM2_135M, gpu_memory_utilization=0.5, **base)
    assert low.max_tokens < bf16.max_tokens


@pytest.mark.parametrize("shrink", [
    dict(),                                           # GQA, 3 K/V heads
    dict(kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=16,
         v_head_dim=16, q_lora_rank=None),            # MLA
])
def test_weights_and_bytes_per_token_match_a_built_model(shrink):
    """The two inputs of the count, measured: parameters of the built
    model, and the bytes its KVCache holds after a prefill of T tokens."""
    config = dataclasses.replace(
        SMOLLM2_135M, name="small", vocab_size=64, hidden_size=48,
        num_hidden_layers=2, num_attention_heads=6, num_key_value_heads=3,
        intermediate_size=64, max_position_embeddings=64, **shrink)
    model = build_small_model(config).eval()
    T = 10
    cache = KVCache(config.num_hidden_layers)
    with torch.no_grad():
        model(torch.zeros(1, T, dtype=torch.long), cache=cache)
    measured = sum(layer.nbytes() for layer in cache.layers) / T  # fp32
    device = 1_000_000.0
    cap = kv_cache_capacity(config, device_bytes=device, bytes_per_param=4,
                            bytes_per_value=4, context_len=T,
                            gpu_memory_utilization=1.0)
    assert cap.kv_bytes_per_token == measured
    assert cap.weights_bytes == 4 * num_parameters(model)
    assert cap.max_tokens == int((device - cap.weights_bytes) // measured)
    assert cap.max_sequences == cap.max_tokens // T


@pytest.mark.parametrize("kwargs, match", [
    (dict(device_bytes="80GB"), "device_bytes must be a real number"),
    (dict(device_bytes=0), "device_bytes"),
    (dict(bytes_per_param=0), "bytes_per_param"),
    (dict(bytes_per_value=-1), "bytes_per_value"),
    (dict(bytes_per_value=float("nan")), "bytes_per_value"),
    (dict(context_len=0), "context_len"),
    (dict(context_len=4096.0), "context_len must be an int"),
    (dict(n_devices=0), "n_devices"),
    (dict(gpu_memory_utilization=1.5), "gpu_memory_utilization"),
    (dict(gpu_memory_utilization=0.0), "gpu_memory_utilization"),
])
def test_bad_arguments_raise(kwargs, match):
    args = dict(device_bytes=80 * GiB, bytes_per_param=2, bytes_per_value=2,
                context_len=4096) | kwargs
    with pytest.raises(error_for(match), match=match):
        kv_cache_capacity(LLAMA2_7B, **args)


def test_config_must_be_a_model_config():
    with pytest.raises(TypeError, match="config must be a ModelConfig"):
        kv_cache_capacity({"num_hidden_layers": 2}, device_bytes=GiB,
                          bytes_per_param=2, bytes_per_value=2,
                          context_len=16)
