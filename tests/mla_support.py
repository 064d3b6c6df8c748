"""The small MLA configuration shared by the tests of the layer
(test_mla.py) and of its configuration (test_mla_config.py)."""
from course_lib.model.mla import MLAConfig


def tiny(**kw) -> MLAConfig:
    base = dict(hidden_size=48, num_attention_heads=4, q_lora_rank=24,
                kv_lora_rank=32, qk_nope_head_dim=8, qk_rope_head_dim=6,
                v_head_dim=10)
    return MLAConfig(**{**base, **kw})
