"""Chapter 14: the chapter's workers (course_lib.distributed.scaling_experiments) on
a pool of 2 ranks. The references are the single-process modules (the
workers report their differences) and the byte formulas.
"""
import time

import pytest
import torch

from course_lib.distributed import scaling_experiments
from course_lib.distributed.launch import Pool


@pytest.mark.distributed
def test_chapter_workers_on_a_pool_of_two():
    """The chapter's workers against the single-process modules (the
    diffs they report) and the byte formulas, in one pool."""
    with Pool(2, timeout=90) as pool:          # generous start-up
        start = time.monotonic()
        tp = pool.run(scaling_experiments.tensor_parallel_run, 2)
        for r in tp:
            for block in ("ffn", "attention"):
                b = r[block]
                assert b["out_diff"] < 1e-5 and b["grad_diff"] < 1e-5
                # one all-reduce of B T D float32 numbers each way
                assert b["forward_all_reduce"] == [2 * 16 * 64 * 4]
                assert b["backward_all_reduce"] == [2 * 16 * 64 * 4]
        assert tp[0]["ffn"]["params"] * 2 == tp[0]["ffn"]["params_full"]
        ep = pool.run(scaling_experiments.expert_parallel_run, 2, n_tokens=16)
        assert all(r["max_diff"] < 1e-5 for r in ep)
        sent = sum(r["stats"][0].bytes_sent for r in ep)
        assert sent == 2 * (2 * 16) * 2 * 32 * 4       # 2 N k D b
        # a sub-group of size 1 inside the pool: rank 1 sits out
        assert pool.run(scaling_experiments.expert_parallel_run, 1, n_tokens=8)[1] is None
        nl = pool.run(scaling_experiments.node_limited_run, 2, limited=True, topk_group=1)
        assert all(r["max_diff"] < 1e-5 for r in nl)
        assert all(int(r["traffic"].remote_nodes.max()) <= 1 for r in nl)
        assert sum(r["cross_node_bytes"] for r in nl) == \
            2 * sum(r["traffic"].slot_bytes for r in nl)
        imb = pool.run(scaling_experiments.imbalance_run, 2, skew=3.0, steps=30, gamma=0.01,
                       repeats=1, n_tokens=128, d_model=32, d_expert=16)
        before = [r["before"]["served"] for r in imb]
        after = [r["after"]["served"] for r in imb]
        assert before[0] > 2 * before[1]               # rank 0 overloaded
        assert max(after) / min(after) < max(before) / min(before)
        assert sum(before) == sum(after) == 2 * 128 * 2
        assert torch.equal(imb[0]["bias"], imb[1]["bias"])  # same update
        assert time.monotonic() - start < 30   # the calls, not start-up


def test_workers_reject_a_size_larger_than_the_world():
    with pytest.raises(ValueError, match="size must be <= world_size=1, "
                       "got 2"):
        scaling_experiments.tensor_parallel_run(0, 1, 2)


def test_node_limited_run_rejects_a_string_flag():
    with pytest.raises(TypeError, match="limited"):
        scaling_experiments.node_limited_run(0, 1, 1, limited="False")
