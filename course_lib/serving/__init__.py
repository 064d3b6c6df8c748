"""Serving a real model fast (chapter 15): a paged KV cache and continuous
batching (``paged_kv_cache``, ``continuous_batching``), speculative
decoding with a model or a prompt-lookup drafter (``speculative_decoding``),
and weight-only quantization (``quantization``). Each trick changes only
the speed or the memory of generation, never (greedy) its output; the tests
check that.
"""
