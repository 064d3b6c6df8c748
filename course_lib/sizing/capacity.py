r"""Capacity planning: how many tokens, and how many sequences, fit on a
device once the weights are loaded.

A server's accelerator memory holds the weights, the activations of the
step being computed, and the KV cache of every sequence it is serving.
The weights are fixed; the cache is what is left, and it decides how many
sequences can be decoded together, which in turn decides how well a
decode step uses the hardware (chapter 9: a batch of $B$ sequences reads
the weights once for all of them).

With $n$ devices of $M$ bytes each, of which a server may use a share
$u$ (vLLM's ``gpu_memory_utilization``, default 0.9: the rest is left to
the CUDA context, the activations and fragmentation; vLLM profiles the
activations and takes them from its share too, which this count leaves
out), $P$ parameters of $b_w$ bytes, and a cache of $c$ values per token
(:func:`~course_lib.sizing.kv_cache_size.kv_values_per_token`) of $b_{kv}$
bytes each:

$$\text{budget} = \max(u\,n\,M - P\,b_w,\ 0), \qquad
N_{\text{tokens}} = \Big\lfloor \frac{\text{budget}}{c\,b_{kv}}
\Big\rfloor, \qquad
N_{\text{seq}}(L) = \Big\lfloor \frac{N_{\text{tokens}}}{L} \Big\rfloor$$

for sequences of $L$ tokens each. Example: Llama-2-7B (6.74 B
parameters, 13.5 GB at fp16; 512 KiB of cache per token at fp16) on one
80 GiB device with $u = 0.9$ has about 59 GiB for the cache: about
121 thousand tokens, 29 sequences of 4,096 tokens.

The $n$ devices are pooled: this holds when the weights are split over
them (tensor or expert parallelism) and each cached token is stored once,
either split by key/value heads (tensor parallelism with $G \ge n$) or
on the device that serves its sequence (data-parallel attention, as
serving systems run DeepSeek-V3's MLA, whose one latent per token cannot
be split by heads). Tensor parallelism over more devices than key/value
heads replicates heads, and the cache takes more than this count says.
"""
from __future__ import annotations

from typing import NamedTuple

from .._util.validation import check_int, check_real
from .configs import ModelConfig, check_model_config
from .kv_cache_size import kv_values_per_token
from .params import weights_bytes

__all__ = ["Capacity", "kv_cache_capacity"]


class Capacity(NamedTuple):
    """What :func:`kv_cache_capacity` finds, over all devices together."""
    weights_bytes: float       # P b_w
    kv_budget_bytes: float     # max(u n M - P b_w, 0): left for the cache
    kv_bytes_per_token: float  # c b_kv
    max_tokens: int            # cached tokens that fit
    max_sequences: int         # sequences of context_len tokens that fit


def kv_cache_capacity(config: ModelConfig, *, device_bytes: float,
                      bytes_per_param: float, bytes_per_value: float,
                      context_len: int, n_devices: int = 1,
                      gpu_memory_utilization: float = 0.9) -> Capacity:
    r"""Tokens and sequences whose KV cache fits beside the weights.

    $$N_{\text{tokens}} = \Big\lfloor \frac{\max(u\,n\,M - P\,b_w, 0)}
    {c\,b_{kv}} \Big\rfloor, \qquad N_{\text{seq}} =
    \Big\lfloor \frac{N_{\text{tokens}}}{L} \Big\rfloor$$

    (see the module text for the symbols and the pooling assumption).

    Args:
        config: a :class:`~course_lib.sizing.configs.ModelConfig` (its
            parameter count $P$ and cached values per token $c$).
        device_bytes: $M$, memory of one device in bytes (80 GiB:
            ``80 * 2**30``).
        bytes_per_param: $b_w$, e.g. 2 (bf16/fp16), 1 (fp8), 0.5 (int4).
        bytes_per_value: $b_{kv}$, bytes of one cached value (2 for a
            bf16/fp16 cache, 1 for fp8 or int8).
        context_len: $L$, tokens per sequence, an int $\ge 1$.
        n_devices: $n$, devices whose memory is pooled, an int $\ge 1$.
        gpu_memory_utilization: $u \in (0, 1]$, the share of each device
            the server uses (vLLM's default 0.9).

    Returns:
        a :class:`Capacity` ``(weights_bytes, kv_budget_bytes,
        kv_bytes_per_token, max_tokens, max_sequences)``; zero tokens
        and sequences when the weights alone do not fit.
    """
    check_model_config(config)
    check_real("device_bytes", device_bytes, positive=True)
    check_real("bytes_per_param", bytes_per_param, positive=True)
    check_real("bytes_per_value", bytes_per_value, positive=True)
    check_int("context_len", context_len, minimum=1)
    check_int("n_devices", n_devices, minimum=1, maximum=1_000_000)
    check_real("gpu_memory_utilization", gpu_memory_utilization,
               positive=True, maximum=1)
    weights = weights_bytes(config, bytes_per_param=bytes_per_param)
    usable = gpu_memory_utilization * n_devices * device_bytes   # u n M
    budget = max(usable - weights, 0.0)
    per_token = kv_values_per_token(config) * bytes_per_value     # c b_kv
    max_tokens = int(budget // per_token)
    return Capacity(weights, budget, per_token, max_tokens,
                    max_tokens // context_len)
