"""Chapter 7 benchmark: training throughput and the LM's gap to its floor.

Trains both chapter-7 models once with the defaults the chapter uses.
Called by ``benchmarks/run.py``; run alone: ``python
benchmarks/training_bench.py``.
"""
from __future__ import annotations

from course_lib.tasks.markov import train_synthetic_lm
from course_lib.tasks.translation_task import (greedy_translate,
                                               train_toy_translation)


def benchmark_chapter7() -> dict[str, float]:
    """Train both chapter-7 models once with their defaults and report
    training throughput (counted target tokens per second of training
    steps, evaluation excluded) and the language model's final gap.

    Returns:
        ``lm_tokens_per_s``, ``translation_tokens_per_s``,
        ``lm_val_loss``, ``entropy_rate``, ``lm_gap_nats`` (val loss minus
        entropy rate), ``lm_gap_to_val_floor`` (minus the true model's
        loss on the same tokens), ``translation_exact_match`` (held out).
    """
    lm = train_synthetic_lm()
    tr = train_toy_translation()
    held = tr.task.held_out
    pred = greedy_translate(tr.model, tr.task, [s for s, _ in held])
    val = lm.history.val_loss[-1]
    return {
        "lm_tokens_per_s": lm.history.tokens / lm.history.seconds,
        "translation_tokens_per_s": tr.history.tokens / tr.history.seconds,
        "lm_val_loss": val, "entropy_rate": lm.entropy_rate,
        "lm_gap_nats": val - lm.entropy_rate,
        "lm_gap_to_val_floor": val - lm.val_floor,
        "translation_exact_match":
            sum(p == t for p, (_, t) in zip(pred, held)) / len(held),
    }


if __name__ == "__main__":
    for key, value in benchmark_chapter7().items():
        print(f"{key}: {value:.4f}")
