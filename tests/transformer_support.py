"""The small encoder-decoder shared by the tests of the Transformer
(test_transformer.py) and of both chapter 6 models together
(test_models.py)."""
from course_lib.model.transformer import Transformer, TransformerConfig


def tiny_transformer(**kw):
    cfg = dict(src_vocab_size=30, tgt_vocab_size=30, d_model=32, n_heads=4,
               d_ff=64, n_layers=2, max_len=40)
    return Transformer(TransformerConfig(**{**cfg, **kw}))
