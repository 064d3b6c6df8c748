r"""One torch thread for loops of small tensor ops.

torch runs one CPU op on ``torch.get_num_threads()`` threads (by default
one per core). At the end of every op the threads wait for each other, and
while they wait they *spin*: they keep their core busy for a while instead
of sleeping, so that the next op can start without waking them. For a big
matmul that is a good trade. For a loop of small ops (decoding one token at
a time, a training step of a tiny model) the op itself takes microseconds,
so the threads spend most of the time waiting at the barrier; and when
another process holds one of the cores, a thread waits for a partner that
is not running at all until the scheduler gives it a time slice.

Measured on the course's 2-core CPU (torch 2.13.0, OpenMP backend): a loop
of a small matmul + softmax ran 68,000 times/s with 2 threads on a quiet
machine and 20,000 times/s with one core busy with another process; with
one thread it ran 74,000-78,000 times/s in both cases. Chapter 9 took 41 s
quiet and 1,243 s with one core busy. The numbers of this fix are in
``benchmarks/load.md``.

:func:`small_ops` runs a block (or a function) on one thread and restores
the previous count afterwards, so large ops elsewhere keep all cores. The
course uses it around its loops of small ops: token-by-token generation
(``sampling.generate``, and so ``decoding.decode_throughput``;
``transformer.greedy_decode``), the RNN's
steps in ``rnn.time_recurrence_vs_attention`` and the one training loop
of its small models (``training.train``, which chapter 1's
``recall.train_recall`` and chapter 5's ``head_analysis.train_induction``
run on), chapter 5's evaluation of its small model
(``head_analysis.accuracy``) and chapter 11's ``train_moe``.
"""
from __future__ import annotations

import contextlib
import os

import torch

from .validation import check_int

__all__ = ["small_ops"]


class small_ops(contextlib.ContextDecorator):
    """Run a block or a function with ``num_threads`` torch threads.

    Use it around loops of small tensor ops, where torch's threads would
    spend more time waiting for each other than computing (see the module
    docstring for the measured effect)::

        with small_ops():
            for step in range(n):
                ...

        @small_ops()
        def train_step(...):
            ...

    The previous ``torch.get_num_threads()`` is restored on leaving the
    block, also when it raises. Blocks can be nested. The setting is
    process-wide (torch has one thread pool), like
    ``torch.set_num_threads``.

    Args:
        num_threads: threads inside the block, ``>= 1`` (default 1), and
            at most the number of CPUs or torch's current count, whichever
            is larger.
    """

    def __init__(self, num_threads: int = 1) -> None:
        check_int("num_threads", num_threads, minimum=1)
        # More threads than CPUs cannot run at once, and OpenMP starts
        # them all on the next parallel op: thousands exhaust the process's
        # threads or address space, and the interpreter aborts there.
        limit = max(os.cpu_count() or 1, torch.get_num_threads())
        if num_threads > limit:
            raise ValueError(f"num_threads must be <= {limit} (the CPUs, "
                             f"or torch's current count), got {num_threads}")
        self.num_threads = num_threads
        self._saved: list[int] = []   # a stack: the object can be reused

    def __enter__(self) -> "small_ops":
        self._saved.append(torch.get_num_threads())
        torch.set_num_threads(self.num_threads)
        return self

    def __exit__(self, *exc) -> bool:
        torch.set_num_threads(self._saved.pop())
        return False
