"""The tiny decoder-only language models shared by the KV-cache tests
(test_kv_cache.py) and the generation tests (test_decoding.py):
``tiny_lm`` and the four attention and position variants in ``MODELS``."""
import torch

from course_lib.model.decoder_lm import DecoderLM, DecoderLMConfig


def tiny_lm(**kw):
    torch.manual_seed(123)
    cfg = dict(vocab_size=23, hidden_size=32, num_attention_heads=4,
               num_hidden_layers=2, max_position_embeddings=40)
    return DecoderLM(DecoderLMConfig(**{**cfg, **kw})).eval()


MODELS = {
    "mha-learned": dict(position="learned", norm="layer", hidden_act="gelu",
                        attention_bias=True, mlp_bias=True),
    "mha-rope": dict(),
    "gqa-rope": dict(num_key_value_heads=2),
    "mqa-rope": dict(num_key_value_heads=1),
}
