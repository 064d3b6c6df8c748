"""The Transformer itself: every ``nn.Module`` the chapters build, and the
functions their forward passes run. Nothing here times, plots or trains.

Read it bottom-up, as the model is built (chapter in brackets):

- ``sinusoidal`` [2]: the frequencies and the sinusoidal table
- ``rope`` [2]: rotary embeddings, ``apply_rope``, ``RotaryEmbedding``
- ``alibi`` [2]: ALiBi's per-head slopes and causal distance bias
- ``attention`` [3]: scaled dot-product attention, explicit and fused
- ``online_softmax`` [3]: attention by key blocks, FlashAttention's loop
- ``masks`` [4]: causal, sliding-window and padding masks
- ``mha`` [5]: multi-head attention with GQA/MQA; the head layout
- ``block`` [6]: FFN, SwiGLU, LayerNorm/RMSNorm, the pre-norm block
- ``qk_norm`` [6]: QK-norm, RMSNorm on each head's queries and keys
- ``transformer`` [6]: the paper's encoder-decoder
- ``decoder_lm`` [6]: a GPT-2/Llama decoder-only language model
- ``kv_cache``, ``kv_quant``, ``rolling_kv_cache`` [9]: the KV cache, its int8
  storage, and a sliding-window cache kept as a ring buffer
- ``yarn``, ``mla`` [10]: multi-head latent attention and its RoPE scaling
- ``routing``, ``load_balancing``, ``moe`` [11]: mixture of experts
"""
