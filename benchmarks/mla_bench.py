"""Chapter 10 benchmark: MLA decode step, explicit vs absorbed path.

``rows()`` returns markdown lines for benchmarks/results.md (``make bench``,
through benchmarks/run.py, writes them there). Run alone: ``python benchmarks/mla_bench.py``.
"""
from __future__ import annotations

import time

import torch

from course_lib.model.masks import causal_mask
from course_lib.model.kv_cache import LayerKVCache
from course_lib.model.mla import MLAConfig, MultiHeadLatentAttention
from course_lib._util.timing import best_time

CACHE_LENGTHS = (512, 2048)
REPEATS = 5
# DeepSeek-V3's shape scaled down: d_c = 4 d_h, d_h^R = d_h / 2, 16 heads.
CONFIG = MLAConfig(hidden_size=1024, num_attention_heads=16,
                   q_lora_rank=384, kv_lora_rank=256, qk_nope_head_dim=64,
                   qk_rope_head_dim=32, v_head_dim=64)


@torch.no_grad()
def decode_step_seconds(module: MultiHeadLatentAttention, *, cache_len: int,
                        absorb: bool, repeats: int = REPEATS) -> float:
    """Fastest time of one decode step (batch 1, one new token) against a
    cache already holding ``cache_len`` positions."""
    torch.manual_seed(0)
    D = module.config.hidden_size
    cache = LayerKVCache()
    module(torch.randn(1, cache_len, D), causal_mask(cache_len),
           cache=cache)                                     # prefill
    x = torch.randn(1, 1, D)

    def step() -> None:
        module(x, cache=cache, absorb=absorb)               # sees S + 1 keys
        cache.crop(cache_len)                               # drop the token

    return best_time(step, repeats)


def rows() -> list[str]:
    """Decode tokens/s of both paths and what each keeps per token."""
    torch.manual_seed(0)
    module = MultiHeadLatentAttention(CONFIG).eval()
    c = CONFIG
    H = c.num_attention_heads
    latent = c.kv_lora_rank + c.qk_rope_head_dim
    expanded = H * (c.qk_head_dim + c.v_head_dim)
    out = ["", "## Chapter 10: MLA decode step, explicit vs absorbed (CPU, "
           "batch 1, one layer, one run)", "",
           f"One MultiHeadLatentAttention layer (D={c.hidden_size}, H={H}, "
           f"r_q={c.q_lora_rank}, d_c={c.kv_lora_rank}, d_h="
           f"{c.qk_nope_head_dim}, d_h^R={c.qk_rope_head_dim}, d_v="
           f"{c.v_head_dim}), fp32, fastest of {REPEATS} steps. Both paths "
           f"cache the same two tensors, c^KV and the rotated k^R: "
           f"{latent} values per token. The explicit path re-computes "
           f"K^C and V^C of every cached position at every step; an "
           f"explicit path that cached the up-projected keys and values "
           f"instead (DeepSeek's 'naive' mode) would keep {expanded} "
           f"values per token ({expanded / latent:.1f}x more; not "
           f"measured here).", "",
           "| cached positions | explicit (tok/s) | absorbed (tok/s) | "
           "speed-up | cache per token, both paths |",
           "|---:|---:|---:|---:|---:|"]
    for S in CACHE_LENGTHS:
        t_exp = decode_step_seconds(module, cache_len=S, absorb=False)
        t_abs = decode_step_seconds(module, cache_len=S, absorb=True)
        out.append(f"| {S} | {1 / t_exp:,.0f} | {1 / t_abs:,.0f} | "
                   f"{t_exp / t_abs:.1f}x | {latent} values |")
    return out


if __name__ == "__main__":
    start = time.perf_counter()
    print("\n".join(rows()))
    print(f"\n({time.perf_counter() - start:.1f} s)")
