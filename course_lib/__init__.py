"""course_lib: the tested library behind the Transformer Internals course.

The folders follow the book:

- ``model/``: the Transformer itself, every ``nn.Module`` the chapters
  build and the functions their forward passes run (start here);
- ``generation/``: from logits to tokens, with and without a KV cache;
- ``training.py``: the one training loop;
- ``tasks/``: the data the chapters train on;
- ``experiments/``: what the chapters measure and probe beside the model;
- ``sizing/``: configurations, parameter counts, cache and weight bytes;
- ``pretrained/``: a real model, SmolLM2-135M, read from its GGUF file;
- ``distributed/``: tensor and expert parallelism over processes;
- ``serving/``: how a server runs a model fast: paged KV cache and
  continuous batching, speculative decoding, weight quantization;
- ``notebook/``: course machinery, not Transformer code (exercises,
  explorers, ``show_source``, the Chinese edition's strings);
- ``_util/``: private helpers (argument checks, timing, threads).

:data:`CHAPTERS` says which chapter introduces which module; the README's
map and the layering test (``tests/test_layering.py``) read it.

Shape letters, the same in every module (a module's docstring lists the
ones it uses, and any of its own):

====  ==============================================================
B     batch
T     tokens in this call: queries, the target, or the new tokens
S     keys/values: the source in cross-attention, or cached + new
D     model width ``d_model`` (``hidden_size`` in every config, the
      Hugging Face name)
H     query heads ``n_heads`` (configs: ``num_attention_heads``)
G     key/value heads ``n_kv_heads`` (configs: ``num_key_value_heads``;
      G = H: MHA, G = 1: MQA)
d_k   width of one head, ``head_dim`` (``d_h`` in chapter 1: RNN state)
V     vocabulary size
F     hidden width of an FFN (``d_ff``, or one expert's ``d_expert``;
      configs: ``intermediate_size``)
E     routed experts; k experts per token
N     tokens with batch and time flattened (routing, MoE); in prose $N$
      is also the paper's number of layers, ``num_hidden_layers`` in
      configs
L     positions of a table, or a length in a complexity argument
...   any leading dimensions
====  ==============================================================
"""

__version__ = "0.1.0"

# chapter -> the modules it introduces, each with what it holds
CHAPTERS: dict[int, dict[str, str]] = {
    1: {"experiments.rnn": "recurrent networks, gradient decay, path "
                           "lengths",
        "experiments.sequential_cost": "the recurrence's sequential steps "
                                       "timed against one attention",
        "experiments.recall": "the recall task by position and by "
                              "content, RNN against attention",
        "experiments.sweeps": "seeded sweeps: stored results, mean and "
                              "range over seeds",
        "experiments.seq2seq_bottleneck": "a tiny translator with and "
                                          "without attention"},
    2: {"model.sinusoidal": "the frequencies and the sinusoidal table",
        "model.rope": "rotary embeddings: apply_rope, RotaryEmbedding",
        "model.alibi": "ALiBi: per-head slopes and the causal distance bias",
        "experiments.position_probes": "the rotation identity, offset dot "
                                       "products, clock hands",
        "experiments.length_extrapolation": "five position schemes "
                                            "trained at one length, tested "
                                            "at longer ones"},
    3: {"model.attention": "scaled dot-product attention, explicit and "
                           "fused",
        "model.online_softmax": "attention by blocks of keys with a "
                                "running max and sum, as in FlashAttention",
        "experiments.score_scaling": "why sqrt(d_k): score variance, the "
                                     "softmax Jacobian, saturation",
        "experiments.attention_cost": "the bytes of the L x L weights, "
                                      "explicit against fused timed, "
                                      "peak memory profiled",
        "experiments.scale_training": "training with and without the "
                                      "1/sqrt(d_k) scale"},
    4: {"model.masks": "causal, sliding-window, padding and additive "
                       "masks",
        "experiments.mask_probes": "next-token pairs, influence matrices, "
                                   "mask plots",
        "tasks.packing": "several documents in one row: positions and a "
                         "block-diagonal mask",
        "experiments.mask_cost": "what a mask costs in time"},
    5: {"model.mha": "multi-head attention with GQA/MQA; split, merge and "
                     "repeat heads",
        "tasks.special_tokens": "PAD, BOS and EOS of the synthetic tasks",
        "experiments.head_analysis": "a small model whose heads can be "
                                     "read",
        "experiments.head_circuits": "the QK and OV circuits of a head",
        "experiments.head_roles": "role scores of heads on real text",
        "experiments.gqa_quality": "MHA, GQA and MQA trained on the same "
                                   "task; MHA to GQA by mean-pooling; "
                                   "heads timed"},
    6: {"model.block": "FFN, SwiGLU, LayerNorm/RMSNorm and the pre-norm "
                       "decoder block",
        "model.qk_norm": "QK-norm: RMSNorm on each head's queries and "
                         "keys",
        "model.transformer": "the paper's encoder-decoder with its "
                             "post-norm layers",
        "model.decoder_lm": "a GPT-2/Llama decoder-only language model",
        "experiments.block_stats": "residuals, norm placement and init in "
                                   "deep stacks: gradients, stream RMS, a "
                                   "plain against a residual training run",
        "experiments.block_variants": "init over seeds; parallel, "
                                      "bias-free, QK-norm and sandwich "
                                      "blocks trained and timed"},
    7: {"training": "the training loop, schedule, checkpoints",
        "tasks.translation_task": "a toy translation with a known answer",
        "tasks.markov": "a synthetic language with an exact entropy rate",
        "tasks.text_corpus": "Python's reference manual as text, a "
                             "character vocabulary",
        "tasks.char_lm": "the committed character model of that text",
        "tasks.ngram": "count-based n-gram baselines",
        "experiments.warmup_sweep": "learning rates with and without "
                                    "warmup; a diverging run",
        "experiments.smollm2_finetune": "a few steps of fine-tuning "
                                        "SmolLM2 on the manual"},
    8: {"generation.sampling": "temperature, top-k, top-p, min-p; "
                               "sampling and generation",
        "generation.penalties": "repetition, frequency and presence "
                                "penalties; no repeated n-grams",
        "generation.beam_search": "beam search with length "
                                  "normalisation; several prompts as "
                                  "one cached batch",
        "generation.speculative": "the acceptance step of speculative "
                                  "decoding"},
    9: {"model.kv_cache": "the KV cache, per layer and per model",
        "generation.decoding": "cached generation, prefix reuse, prefill "
                               "against decode",
        "sizing.kv_cache_size": "the bytes of a KV cache from a config",
        "sizing.capacity": "how many sequences fit on one device",
        "generation.ragged": "batched generation of prompts of different "
                             "lengths: left padding, per-row positions",
        "model.kv_quant": "int8 quantisation of cached keys and values",
        "model.rolling_kv_cache": "a sliding-window cache as a ring "
                                  "buffer"},
    10: {"model.yarn": "YaRN: the RoPE correction of a long context",
         "model.mla": "multi-head latent attention, explicit and absorbed",
         "pretrained.fp8_blocks": "FP8 weights with one scale per "
                                  "128 x 128 block",
         "experiments.attention_variants": "MHA, GQA, MQA and MLA trained "
                                           "at a matched cache size"},
    11: {"model.routing": "top-k and DeepSeek-V3 routers",
         "model.load_balancing": "expert load, auxiliary loss, bias "
                                 "update",
         "model.moe": "the mixture-of-experts layer",
         "experiments.moe_vs_dense": "an MoE against dense models of its "
                                     "active and total width"},
    12: {"sizing.configs": "ModelConfig and the published configurations",
         "sizing.params": "parameter counts, total and active; weight "
                          "bytes",
         "sizing.from_config": "a small course model built from a "
                               "configuration",
         "sizing.activations": "activation memory of training, with and "
                               "without recomputation"},
    13: {"pretrained.gguf_file": "reading a GGUF file; Q4_1 and Q8_0",
         "pretrained.tokenizer": "the byte-level BPE tokenizer of the "
                                 "file",
         "pretrained.bpe": "a short pure-Python BPE encoder for reading",
         "pretrained.smollm2": "SmolLM2-135M loaded into a DecoderLM",
         "experiments.interpret": "attention maps of a real model",
         "pretrained.requantize": "Q4_0 round trip: the cost of one more "
                                  "4-bit step",
         "experiments.ablation": "switching attention heads off"},
    14: {"distributed.launch": "worker processes: run once, or a Pool "
                               "kept across cells",
         "distributed.collectives": "Megatron's f/g and a differentiable "
                                    "all-to-all",
         "distributed.tensor_parallel": "column/row-parallel linear, "
                                        "SwiGLU and attention",
         "distributed.expert_parallel": "MoE experts spread over ranks",
         "distributed.node_routing": "traffic across node boundaries",
         "distributed.scaling_experiments": "the chapter's experiments as "
                                            "spawnable workers",
         "distributed.comm_model": "a collective's time: alpha-beta fit "
                                   "and the bytes on the wire",
         "distributed.overlap": "an all-to-all hidden behind expert "
                                "compute: two micro-batches",
         "distributed.torchrun_check": "the parallel layers checked under "
                                       "torchrun: env://, gloo or NCCL",
         "distributed.dtensor_tp": "PyTorch's own tensor parallelism, "
                                   "DTensor and parallelize_module, checked "
                                   "against the course's layers",
         "distributed.data_parallel": "data parallelism with DDP, ZeRO/FSDP "
                                      "sharding: gradients and bytes per "
                                      "rank",
         "distributed.sequence_parallel": "sequence parallelism: "
                                          "reduce-scatter and all-gather "
                                          "around the norms"},
    15: {"serving.paged_kv_cache": "a KV cache of fixed-size blocks with "
                                   "a block table per sequence",
         "serving.continuous_batching": "a scheduler that admits and "
                                        "retires requests between decode "
                                        "steps: batch_generate",
         "serving.speculative_decoding": "draft, verify, accept: with a "
                                         "draft model or prompt lookup",
         "serving.quantization": "weight-only int8 and 4-bit linear "
                                 "layers; perplexity on held-out text"},
}
