"""course_lib: the tested library behind the Transformer Internals course.

One module per concept; each chapter imports its modules and shows their
code. A module only imports modules of its own or earlier chapters, or the
shared helpers (the first group below).

Shared helpers
- ``validation``: the argument checks behind every ValueError
- ``timing``: best-of-n wall-clock timing for measurements and benchmarks
- ``training``: the one training loop (explained in chapter 7; the small
  experiments of chapters 1 and 5 already run on it)
- ``special_tokens``: PAD, BOS, EOS and IGNORE of the synthetic tasks
- ``threads``: ``small_ops``, one torch thread for loops of small tensor
  ops (fast on a busy machine too)
- ``widgets``: explorers (live ipywidgets + static HTML frame players);
  ``frames``: how a frame is drawn so that its text reads at body size
- ``markdown``: the small Markdown-to-HTML converter of prompts and
  feedback; ``source``: ``show_source``
- ``exercise_base``, ``answers``, ``exercises``: the exercise contract
  (``Exercise``, ``Feedback``), reading a numeric answer
  (``parse_number``), and the numeric and choice exercises;
  ``function_exercise`` (learner code under a time limit) and
  ``diagnosed_exercise`` (the same, naming the usual mistake a wrong
  answer matches)

Part I, why attention
- ``rnn``: recurrent networks, gradient decay, path lengths (chapter 1)
- ``sequential_cost``: the recurrence's sequential steps timed against
  one self-attention (chapter 1)
- ``recall``: the recall experiment, RNN against attention (chapter 1)
- ``sinusoidal``: the frequencies and the sinusoidal table (chapter 2)
- ``positional``: RoPE and ``RotaryEmbedding`` (chapter 2)

Part II, attention
- ``attention``: scaled dot-product attention, explicit vs fused timing
  (chapter 3)
- ``score_scaling``: why the scores are divided by sqrt(d_k): score
  variance, the softmax Jacobian and saturation (chapter 3)
- ``masking``: causal, sliding-window and padding masks, additive masks,
  influence matrices, mask plots (chapter 4)
- ``heads``: splitting, merging and repeating heads, 4-D masks, query
  positions (chapter 5)
- ``mha``: multi-head attention with GQA/MQA and a position hook for RoPE
  (chapter 5)
- ``head_analysis``: a small model whose heads can be read (chapter 5)
- ``head_circuits``: the QK and OV circuits of a head (chapter 5)
- ``head_roles``: role scores of heads on real text, with baselines
  (chapter 5)

Part III, the model
- ``layers``: FFN, SwiGLU, LayerNorm/RMSNorm, parameter counts (chapter 6)
- ``blocks``: the paper's post-norm encoder/decoder layers and the
  pre-norm decoder block (chapter 6)
- ``transformer``: the paper's encoder-decoder (chapter 6)
- ``decoder_lm``: a GPT-2/Llama decoder-only language model (chapter 6)
- ``translation_task``: a toy translation with a known answer (chapter 7)
- ``markov``: a synthetic language with an exact entropy rate (chapter 7)
- ``text_corpus``: real text, Python's reference manual split by topic,
  and a character vocabulary (chapter 7)
- ``char_lm``: the committed character model of that text and bits per
  character (chapter 7)
- ``ngram``: count-based n-gram baselines, add-k smoothing (chapter 7)
- ``logit_filters``: temperature, top-k, top-p and min-p (chapter 8)
- ``sampling``: sampling one token and generation (chapter 8)
- ``beam_search``: beam search with length normalisation (chapter 8)

Part IV, inference and scale
- ``kv_cache``: the KV cache and its size for MHA/GQA/MQA/MLA (chapter 9)
- ``decoding``: cached generation, prefix reuse, prefill vs decode cost
  (chapter 9)
- ``mla_config``: MLA's configuration and parameter formula (chapter 10)
- ``mla``: multi-head latent attention, explicit and absorbed (chapter 10)
- ``yarn``: YaRN, the RoPE frequency correction and softmax scale of
  DeepSeek-V3's 128K context (chapter 10)
- ``routing``: top-k and DeepSeek-V3 routers (chapter 11)
- ``load_balancing``: expert load, the Switch auxiliary loss and
  DeepSeek-V3's bias update (chapter 11)
- ``moe``: the mixture-of-experts layer (chapter 11)
- ``model_config``, ``model_configs``, ``params``, ``build``: the
  configuration dataclass, published configurations,
  analytic parameter counts (total and active), and the course model built
  from a configuration (chapter 12)

Part V, a real model at scale
- ``gguf_file``: reading a GGUF file, Q4_1 and Q8_0 dequantisation
  (chapter 13)
- ``tokenizer``: the byte-level BPE tokenizer of a GGUF file (chapter 13)
- ``bpe``: a short pure-Python BPE encoder for teaching (chapter 13)
- ``pretrained``: SmolLM2-135M loaded into a ``DecoderLM`` by renaming
  (chapter 13)
- ``interpret``: attention maps of a real model, block by block
  (chapter 13)
- ``parallel``: ``run``, a worker on N local gloo processes (chapter 14)
- ``collectives``: Megatron's $f$/$g$ and a differentiable all-to-all,
  the collectives of tensor and expert parallelism (chapter 14)
- ``tensor_parallel``: Megatron-style column/row-parallel layers, SwiGLU
  and attention split over ranks (chapter 14)
- ``expert_parallel``: MoE experts spread over ranks, dispatch and combine
  all-to-alls and their byte counters (chapter 14)
- ``parallel_checks``: workers that compare the parallel layers with the
  single-process ones (chapter 14)
- ``parallel_pool``: ``Pool``, ranks and their process group started once
  and reused across notebook cells (chapter 14)
- ``node_routing``: traffic that crosses node boundaries, per slot and
  per node (chapter 14)
- ``scaling_experiments``: chapter 14's experiments as spawnable workers
  (chapter 14)

Shape letters, the same in every module (a module's docstring lists the
ones it uses, and any of its own):

====  ==============================================================
B     batch
T     tokens in this call: queries, the target, or the new tokens
S     keys/values: the source in cross-attention, or cached + new
D     model width ``d_model`` (``hidden_size`` in Hugging Face configs)
H     query heads ``n_heads``
G     key/value heads ``n_kv_heads`` (G = H: MHA, G = 1: MQA)
d_k   width of one head, ``head_dim`` (``d_h`` in chapter 1: RNN state)
V     vocabulary size
F     hidden width of an FFN (``d_ff``, or one expert's ``d_expert``)
E     routed experts; k experts per token
N     tokens with batch and time flattened (routing, MoE); in prose $N$
      is also the paper's number of layers, ``n_layers`` in code
L     positions of a table, or a length in a complexity argument
...   any leading dimensions
====  ==============================================================
"""

__version__ = "0.1.0"
