"""Pins: the exact wording of error messages of course_lib.model.routing.
They keep messages from changing by accident; the behaviour itself is
specified in tests/test_routing.py.

Found by mutation testing (benchmarks/mutation.md, "routing survivors
and why"): a mutant that changes only a message is killed here, so
`make mutation` runs this file with the behaviour tests ([tool.mutmut]
in pyproject.toml). Each test is the message part of a test in
tests/test_routing.py, which checks the same calls with a short match.
"""
import pytest
import torch

from course_lib.model.routing import (DeepSeekV3Router, TopKRouter,
                                      group_limited_mask)
from errors import error_for


# from test_router_argument_edges (formerly
# test_router_argument_edges_and_messages)
def test_router_argument_messages():
    r = TopKRouter(4, 3, 1)
    for args, msg in (((0, 3, 1), r"^d_model must be >= 1, got 0$"),
                      ((4, 0, 1), r"^n_experts must be >= 1, got 0$")):
        with pytest.raises(error_for(msg), match=msg):
            TopKRouter(*args)
    with pytest.raises(ValueError, match=r"^x must have shape \(\.\.\., 4\), "
                       r"got \(2, 3\)$"):
        r(torch.zeros(2, 3))
    with pytest.raises(ValueError, match=r"^x must have shape \(\.\.\., 4\), "
                       r"got \[1\.0\]$"):
        r([1.0])
    with pytest.raises(ValueError, match=r"^x must have shape \(\.\.\., 4\), "
                       r"got \(\)$"):
        r(torch.tensor(1.0))


# from test_group_limited_mask_and_v3_edges (formerly
# test_group_limited_mask_and_v3_edges_and_messages)
def test_group_limited_mask_and_v3_messages():
    s = torch.rand(2, 8)
    with pytest.raises(ValueError, match=r"^scores must be a tensor \(N, E\), "
                       r"got \[1\]$"):
        group_limited_mask([1], n_group=1, topk_group=1)
    for kw, msg in ((dict(n_group=0, topk_group=1),
                     r"^n_group must be >= 1, got 0$"),
                    (dict(n_group=2, topk_group=0),
                     r"^topk_group must be >= 1, got 0$")):
        with pytest.raises(error_for(msg), match=msg):
            group_limited_mask(s, **kw)
        with pytest.raises(error_for(msg), match=msg):
            DeepSeekV3Router(4, 8, 2, **kw)
    with pytest.raises(ValueError, match=r"^top_k must be <= experts in the "
                       r"kept groups \(4\), got 5$"):
        DeepSeekV3Router(4, 8, 5, n_group=4, topk_group=2)


def test_flag_nan_and_size_messages_in_full():
    from course_lib.model.routing import select_top_k
    for call, msg in (
            (lambda: select_top_k(torch.rand(2, 4), 2, normalize=1),
             r"^normalize must be a bool, got int 1$"),
            (lambda: TopKRouter(8, 4, 2, normalize=1),
             r"^normalize must be a bool, got int 1$"),
            (lambda: DeepSeekV3Router(8, 4, 2, norm_topk_prob=1),
             r"^norm_topk_prob must be a bool, got int 1$"),
            (lambda: group_limited_mask(torch.tensor([[float("nan"), 1.0]]),
                                        n_group=1, topk_group=1),
             r"^scores must not hold NaN$"),
            (lambda: TopKRouter(10**5, 10**4, 2),
             r"^n_experts \* d_model asks for 1,000,000,000 values \(3.7 GiB"
             r" as float32\), more than the 268,435,456 one call may "
             r"allocate$")):
        with pytest.raises(error_for(msg), match=msg):
            call()
