"""Train and commit chapter 7's synthetic-language model: `make checkpoints`.

Runs ``course_lib.tasks.markov.train_synthetic_lm(seed=0)`` (seeded; the
training loop runs on one torch thread) and writes it to
``course_lib/data/synthetic_lm.pt`` (float32 weights, config, history:
about 0.4 MB), which chapters 7 and 8 load with ``load_synthetic_lm``
instead of training it. A unit test
(``test_committed_synthetic_lm_is_what_the_recipe_trains_now``) runs the
recipe and compares, so a stale file fails ``make test``.

Usage: ``python scripts/save_synthetic_lm.py [--out PATH]``.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

from course_lib.tasks import markov


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=markov.SYNTHETIC_LM_PATH)
    args = parser.parse_args()
    start = time.perf_counter()
    run = markov.train_synthetic_lm(seed=0)
    markov.save_synthetic_lm(run, args.out)
    print(f"wrote {args.out} ({args.out.stat().st_size / 1e6:.2f} MB) after "
          f"{time.perf_counter() - start:.1f} s; validation loss "
          f"{run.history.val_loss[-1]:.4f} nats")


if __name__ == "__main__":
    main()
