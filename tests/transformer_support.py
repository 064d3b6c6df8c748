"""The small encoder-decoder shared by the tests of the Transformer
(test_transformer.py) and of both chapter 6 models together
(test_models.py)."""
from course_lib.model.transformer import Transformer, TransformerConfig


def tiny_transformer(**kw):
    cfg = dict(src_vocab_size=30, tgt_vocab_size=30, hidden_size=32,
               num_attention_heads=4, intermediate_size=64,
               num_hidden_layers=2, max_position_embeddings=40)
    return Transformer(TransformerConfig(**{**cfg, **kw}))
