r"""How many bytes a KV cache holds, from a model's configuration alone.

Per token and layer, multi-head attention caches a key and a value for
each of its $G$ key/value heads, $2 \cdot G \cdot d_h$ values ($G = h$ for
MHA, fewer for GQA, 1 for MQA); multi-head latent attention caches the
latent $c^{KV}$ and the shared RoPE key, $d_c + d_h^R$ values. The cache
itself is :mod:`course_lib.model.kv_cache`.
"""
from __future__ import annotations

from numbers import Real

from .._util.validation import check_int, config_field

__all__ = ["kv_values_per_token", "kv_cache_bytes"]


# ------------------------------------------------------------ cache size
def _config_int(config, name, required=True):
    """``config.name``, checked to be an int >= 1; ``None`` if the config
    has no such field (or it is None) and it is not ``required``."""
    if not required:
        value = config_field(config, name, default=None)
    else:
        value = config_field(config, name)
    if value is not None:
        check_int(f"config.{name}", value, minimum=1)
    return value


def kv_values_per_token(config, *, n_layers: int | None = None) -> int:
    r"""Cached values per token, summed over layers (batch 1).

    Multi-head, grouped-query and multi-query attention cache a key and a
    value of width $d_h$ for each of the $G$ key/value heads in each of
    the $l$ layers; multi-head latent attention caches the latent
    $c^{KV}$ and the shared RoPE key $k^R$:

    $$\text{MHA/GQA/MQA: } 2 \cdot G \cdot d_h \cdot l, \qquad
    \text{MLA: } (d_c + d_h^R) \cdot l.$$

    Attributes have their Hugging Face names, as in every config of the
    course: layers ``num_hidden_layers``; width ``hidden_size``; heads
    ``num_attention_heads``; K/V heads ``num_key_value_heads`` (None:
    $G = h$); $d_h$ = ``head_dim`` if set, else width // heads. A config with a
    ``kv_lora_rank`` that is not None is MLA: $d_c$ = ``kv_lora_rank``,
    $d_h^R$ = ``qk_rope_head_dim``.

    Args:
        config: a config object (``DecoderLMConfig``, an MLA config, a
            Hugging Face config, ``ModelConfig``, a namespace...).
        n_layers: count this many layers instead of the config's.

    Returns:
        Values (not bytes) per token.
    """
    if n_layers is None:
        n_layers = _config_int(config, "num_hidden_layers")
    else:
        check_int("n_layers", n_layers, minimum=0)
    if config_field(config, "kv_lora_rank", default=None) is not None:
        # MLA: c^KV (d_c) and the shared k^R (d_h^R), one of each per layer
        d_c = _config_int(config, "kv_lora_rank")
        d_rope = _config_int(config, "qk_rope_head_dim")
        return (d_c + d_rope) * n_layers
    heads = _config_int(config, "num_attention_heads")
    kv_heads = _config_int(config, "num_key_value_heads",
                           required=False) or heads
    head_dim = _config_int(config, "head_dim", required=False)
    if head_dim is None:
        width = _config_int(config, "hidden_size")
        head_dim = width // heads
    # K and V: 2 G d_h values per layer
    return 2 * kv_heads * head_dim * n_layers


def kv_cache_bytes(config, n_tokens: int, *, bytes_per_value: float = 2,
                   n_layers: int | None = None) -> int | float:
    r"""Bytes of the KV cache for ``n_tokens`` tokens of one sequence.

    $$\text{bytes} = \text{values per token} \times n_{\text{tokens}}
    \times \text{bytes per value},$$

    with the values per token of :func:`kv_values_per_token`. A batch of
    $B$ sequences needs $B$ times as much. Example: Llama-2-7B (32 layers,
    32 heads, $d_h = 128$) at fp16 needs $2 \cdot 32 \cdot 128 \cdot 32
    \cdot 2$ B = 512 KiB per token.

    Args:
        config: as in :func:`kv_values_per_token`.
        n_tokens: cached positions, an int $\ge 0$.
        bytes_per_value: 2 for fp16/bf16 (default), 4 for fp32, 1 for
            8-bit; fractions (0.5 for 4-bit) are allowed.
        n_layers: count this many layers instead of the config's.

    Returns:
        Bytes (an int when ``bytes_per_value`` is an int).
    """
    check_int("n_tokens", n_tokens, minimum=0)
    if isinstance(bytes_per_value, bool) or not isinstance(
            bytes_per_value, Real) or not 0 < bytes_per_value < float("inf"):
        raise ValueError(f"bytes_per_value must be a number > 0, got "
                         f"{bytes_per_value!r}")
    per_token = kv_values_per_token(config, n_layers=n_layers)
    return per_token * n_tokens * bytes_per_value
