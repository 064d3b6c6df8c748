"""Chapter 9 benchmark: decode tokens/s with and without the KV cache.

``rows()`` returns markdown lines for benchmarks/results.md (``make bench``,
through benchmarks/run.py, writes them there). Run alone: ``python benchmarks/kv_cache_bench.py``.
"""
from __future__ import annotations

import time

import torch

from course_lib.generation.decoding import decode_throughput
from course_lib.sizing.kv_cache_size import kv_cache_bytes
from course_lib.model.decoder_lm import DecoderLM, DecoderLMConfig
from course_lib.sizing.params import num_parameters

PROMPT_LEN = 16
LENGTHS = (128, 512, 1024)
# Small enough that the uncached 1024-token run stays well under a minute
# on a 2-core CPU, big enough that per-step compute, not Python overhead,
# dominates the uncached runs.
CONFIG = DecoderLMConfig(vocab_size=256, hidden_size=128,
                         num_attention_heads=4, num_hidden_layers=4,
                         max_position_embeddings=PROMPT_LEN + max(LENGTHS))


def rows() -> list[str]:
    """Tokens/s with vs without cache at each generated length, one run."""
    torch.manual_seed(0)
    model = DecoderLM(CONFIG).eval()
    c = CONFIG
    out = ["", "## Chapter 9: decoding with vs without the KV cache (CPU, "
           "batch 1, greedy, one run)", "",
           f"DecoderLM with {num_parameters(model):,} parameters "
           f"(d_model={c.hidden_size}, {c.num_hidden_layers} layers, "
           f"{c.num_attention_heads} heads, "
           f"RoPE, SwiGLU, vocab {c.vocab_size}), prompt of {PROMPT_LEN} "
           f"tokens; fp32 cache of "
           f"{kv_cache_bytes(c, 1, bytes_per_value=4):,} bytes per token. "
           "Each row times one full generation per mode (after a short "
           "warm-up).", "",
           "| new tokens | with cache (tok/s) | without cache (tok/s) | "
           "speed-up |",
           "|---:|---:|---:|---:|"]
    for n in LENGTHS:
        cached = decode_throughput(model, prompt_len=PROMPT_LEN,
                                   new_tokens=n, use_cache=True)
        full = decode_throughput(model, prompt_len=PROMPT_LEN,
                                 new_tokens=n, use_cache=False)
        out.append(f"| {n} | {cached:,.0f} | {full:,.0f} | "
                   f"{cached / full:.1f}x |")
    return out


if __name__ == "__main__":
    start = time.perf_counter()
    print("\n".join(rows()))
    print(f"\n({time.perf_counter() - start:.1f} s)")
