"""Pins: the exact wording of error messages of course_lib.model.mla's
configuration and parameter count. They keep messages from changing by
accident; the behaviour itself is specified in tests/test_mla_config.py.

Found by mutation testing (benchmarks/mutation.md, "mla_config survivors
and why"): a mutant that changes only a message is killed here, so
`make mutation` runs this file with the behaviour tests ([tool.mutmut]
in pyproject.toml).
"""
from types import SimpleNamespace

import pytest


def test_param_count_message_names_the_missing_fields():
    from course_lib.model.mla import mla_param_count
    with pytest.raises(TypeError, match=r"^config must be an MLA configuration"
                       r" \(MLAConfig or ModelConfig\), got SimpleNamespace "
                       r"without num_attention_heads, kv_lora_rank, "
                       r"q_lora_rank, qk_nope_head_dim, qk_rope_head_dim, "
                       r"v_head_dim, attention_bias$"):
        mla_param_count(SimpleNamespace(hidden_size=8))
