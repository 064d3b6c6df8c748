"""course_lib: the tested library behind the Transformer Internals course.

One module per concept; each chapter imports its module and shows its code.

- ``widgets``, ``exercises``: explorers (live ipywidgets + static HTML frame
  players) and widget-checked exercises, used by every chapter
- ``validation``: the shared argument checks behind every ValueError
- ``timing``: best-of-n wall-clock timing for measurements and benchmarks
- ``threads``: ``small_ops``, one torch thread for loops of small tensor ops
  (fast on a busy machine too; issue 17)
- ``rnn``: recurrent networks and their limits (chapter 1)
- ``positional``: sinusoidal encodings and RoPE (chapter 2)
- ``attention``: scaled dot-product attention and masks (chapters 3-4)
- ``masking``: additive masks, influence matrices, mask plots (chapter 4)
- ``mha``: multi-head attention with GQA/MQA (chapter 5)
- ``head_analysis``: a small model whose heads can be read (chapter 5)
- ``layers``, ``blocks``, ``models``: FFNs and norms, encoder/decoder
  layers and pre-norm blocks, the Transformer and a decoder-only LM
  (chapter 6)
- ``data``, ``training``: a toy translation task, a synthetic language with
  an exact entropy rate, and the training loop (chapter 7)
- ``sampling``: temperature, top-k, top-p and generation (chapter 8)
- ``kv_cache``, ``decoding``: the KV cache, cached generation, prefix
  reuse, cache sizes and the cost of prefill vs decode (chapter 9)
- ``mla``: multi-head latent attention, explicit and absorbed (chapter 10)
- ``routing``, ``moe``: top-k and DeepSeek-V3 routers, load balancing, and
  the mixture-of-experts layer (chapter 11)
- ``model_configs``, ``params``, ``build``: published configurations,
  analytic parameter counts (total and active), and the course model
  built from a configuration (chapter 12)
"""

__version__ = "0.1.0"
