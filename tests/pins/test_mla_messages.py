"""Pins: the exact wording of error messages of course_lib.model.mla's
MultiHeadLatentAttention. They keep messages from changing by accident;
the behaviour itself is specified in tests/test_mla.py.

Found by mutation testing (benchmarks/mutation.md, "MLA survivors and
why"): a mutant that changes only a message is killed here, so
`make mutation` runs this file with the behaviour tests ([tool.mutmut]
in pyproject.toml).
"""
import pytest
import torch

from course_lib.model.kv_cache import KVCache
from course_lib.model.mla import MultiHeadLatentAttention
from test_mla import make


def test_bad_input_messages_in_full():
    with pytest.raises(TypeError, match=r"^config must be an MLAConfig, got"
                       r" dict$"):
        MultiHeadLatentAttention({"hidden_size": 8})
    m = make()
    with pytest.raises(TypeError, match=r"^cache must be a LayerKVCache, "
                       r"got KVCache$"):
        m(torch.randn(1, 2, 48), cache=KVCache(1))
    with pytest.raises(ValueError, match=r"^x must have shape \(B, T, "
                       r"hidden_size=48\), got \[1.0, 2.0\]$"):
        m([1.0, 2.0])
    with pytest.raises(ValueError, match=r"^x must have shape \(B, T, "
                       r"hidden_size=48\), got \(5, 48\)$"):
        m(torch.randn(5, 48))                    # no batch axis


def test_argument_names_in_full():
    from course_lib.model.mla import MLAConfig, deepseek_yarn
    with pytest.raises(ValueError, match=r"^mscale must be > 0, got 0$"):
        deepseek_yarn(mscale=0)
    with pytest.raises(TypeError, match=r"^absorb must be a bool, got int "
                       r"1$"):
        MultiHeadLatentAttention(MLAConfig(), absorb=1)
    with pytest.raises(TypeError, match=r"^absorb must be None or a bool, "
                       r"got int 1$"):
        make()(torch.randn(1, 2, 48), absorb=1)
    # four times DeepSeek-V3's width: 584,845,312 parameters in one layer
    with pytest.raises(ValueError, match=r"^the parameters of config asks "
                       r"for 584,845,312 values \(2.2 GiB as float32\), "
                       r"more than the 268,435,456 one call may allocate$"):
        MultiHeadLatentAttention(MLAConfig.deepseek_v3(hidden_size=4 * 7168))
