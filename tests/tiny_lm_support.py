"""The tiny decoder-only language models shared by the KV-cache tests
(test_kv_cache.py) and the generation tests (test_decoding.py):
``tiny_lm`` and the four attention and position variants in ``MODELS``."""
import torch

from course_lib.model.decoder_lm import DecoderLM, DecoderLMConfig


def tiny_lm(**kw):
    torch.manual_seed(123)
    cfg = dict(vocab_size=23, d_model=32, n_heads=4, n_layers=2, max_len=40)
    return DecoderLM(DecoderLMConfig(**{**cfg, **kw})).eval()


MODELS = {
    "mha-learned": dict(positions="learned", norm="layer", ffn="gelu",
                        bias=True),
    "mha-rope": dict(),
    "gqa-rope": dict(n_kv_heads=2),
    "mqa-rope": dict(n_kv_heads=1),
}
