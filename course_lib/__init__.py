"""course_lib: the tested library behind the Transformer Internals course.

One module per concept; each chapter imports its module and shows its code.

- ``widgets``, ``exercises``: explorers (live ipywidgets + static HTML frame
  players) and widget-checked exercises, used by every chapter
- ``validation``: the shared argument checks behind every ValueError
- ``timing``: best-of-n wall-clock timing for measurements and benchmarks
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
"""

__version__ = "0.1.0"
