"""Chapter 11 benchmark: an MoE layer vs dense SwiGLU FFNs.

Compares the forward time of an :class:`course_lib.model.moe.MoE` layer with a
dense SwiGLU that has the same *total* parameters (hidden width E F) and
one with the same *active* parameters (hidden width k F). ``rows()``
returns markdown lines for benchmarks/results.md (``make bench``,
through benchmarks/run.py, writes them there). Run alone: ``python benchmarks/moe_bench.py``.
"""
from __future__ import annotations

import time

import torch

from course_lib.model.block import SwiGLU
from course_lib.model.moe import MoE
from course_lib._util.timing import best_time

N_TOKENS = 4096          # one batch of tokens, e.g. 8 sequences x 512
D_MODEL = 256
# (experts E, top-k, expert width F): Mixtral-like 8 x top-2 and a
# fine-grained DeepSeek-like 64 x top-6 with narrower experts.
CASES = ((8, 2, 512), (64, 6, 128))
REPEATS = 3


def _params(m: torch.nn.Module) -> int:
    return sum(p.numel() for p in m.parameters())


def measure(n_experts: int, top_k: int, d_expert: int, *,
            n_tokens: int = N_TOKENS, d_model: int = D_MODEL,
            repeats: int = REPEATS) -> dict:
    """Seconds per forward (best of ``repeats``) of the MoE layer and of
    the two dense baselines, on one batch of random tokens."""
    torch.manual_seed(0)
    moe = MoE(d_model, n_experts=n_experts, top_k=top_k, d_expert=d_expert)
    same_total = SwiGLU(d_model, n_experts * d_expert)
    same_active = SwiGLU(d_model, top_k * d_expert)
    x = torch.randn(n_tokens, d_model)
    with torch.no_grad():
        t = {name: best_time(lambda m=m: m(x), repeats)
             for name, m in (("moe", moe), ("total", same_total),
                             ("active", same_active))}
    t["params"] = {"moe": _params(moe), "active": moe.active_parameters(),
                   "total": _params(same_total),
                   "dense_active": _params(same_active)}
    return t


def rows() -> list[str]:
    """One table: MoE time vs dense same-total and same-active FFNs."""
    out = ["", "## Chapter 11: MoE layer vs dense FFNs (CPU, forward, "
           "one run)", "",
           f"{N_TOKENS} tokens of width {D_MODEL}; SwiGLU experts; best of "
           f"{REPEATS} forward passes after a warm-up. *Same total*: one "
           "SwiGLU of hidden width E F (the parameters the MoE stores); "
           "*same active*: hidden width k F (the parameters one token "
           "uses). Ratios are MoE time / dense time.", "",
           "| E, k, F | MoE params (active) | MoE (ms) | same-active "
           "(ms) | same-total (ms) | MoE / same-active | MoE / "
           "same-total |",
           "|---|---:|---:|---:|---:|---:|---:|"]
    for E, k, F in CASES:
        t = measure(E, k, F)
        p = t["params"]
        out.append(f"| {E}, {k}, {F} | {p['moe'] / 1e6:.2f}M "
                   f"({p['active'] / 1e6:.2f}M) | {t['moe'] * 1e3:.1f} | "
                   f"{t['active'] * 1e3:.1f} | {t['total'] * 1e3:.1f} | "
                   f"{t['moe'] / t['active']:.2f} | "
                   f"{t['moe'] / t['total']:.2f} |")
    return out


if __name__ == "__main__":
    start = time.perf_counter()
    print("\n".join(rows()))
    print(f"\n({time.perf_counter() - start:.1f} s)")
