r"""The course's character-level language model of the Python manual.

A Llama-style :class:`~course_lib.model.decoder_lm.DecoderLM` (RoPE, RMSNorm,
SwiGLU, tied embeddings) over the 96 characters of
:data:`~course_lib.tasks.text_corpus.PRINTABLE`, trained on the training topics
of :func:`~course_lib.tasks.text_corpus.load_pydoc_corpus` by
``make checkpoints`` (``scripts/train_char_lm.py``, which calls
:func:`train_char_lm` with :data:`TRAIN_SETTINGS`). The trained weights
ship inside the package, :data:`CHECKPOINT_PATH`, stored in float16 to
halve the file (the model computes in float32; rounding its weights to
float16 left its validation bits per character unchanged to four
decimals, 2.1053: compare ``load_char_lm_info()["val_bits_per_char"]``
with ``["val_bits_per_char_float32"]``).

Quality is measured in **bits per character**: the mean of
$-\log_2 q(x_t \mid x_{<t})$ over the characters of a text, which is the
cross-entropy in nats divided by $\ln 2$. Unlike a loss per token it
compares models with different tokenisers: a model with tokens of several
characters spends its bits per token on more characters.

Shape letters: B batch, T length, V vocabulary (96).
"""
from __future__ import annotations

import math
from pathlib import Path

import torch
import torch.nn.functional as F

from .._util.validation import check_bool, check_int, check_real, check_type
from ..model.decoder_lm import DecoderLM, DecoderLMConfig
from ..training import History, read_state_file, save_state_file, train
from .text_corpus import CharVocab, char_batches, load_pydoc_corpus

__all__ = ["CHECKPOINT_PATH", "MODEL_CONFIG", "TRAIN_SETTINGS",
           "char_lm_config", "train_char_lm", "bits_per_char", "save_char_lm",
           "load_char_lm", "load_char_lm_info"]

#: The committed checkpoint (package data: see ``pyproject.toml``).
CHECKPOINT_PATH = Path(__file__).resolve().parents[1] / "data" / \
    "char_lm_pydoc.pt"

#: The architecture of the committed model.
MODEL_CONFIG = dict(vocab_size=96, hidden_size=128, num_attention_heads=4,
                    num_hidden_layers=4, max_position_embeddings=128,
                    dropout=0.0)
#: How ``make checkpoints`` trains it (AdamW, warmup, cosine, clip 1).
TRAIN_SETTINGS = dict(steps=400, batch_size=32, length=128, lr=3e-3,
                      warmup_steps=50, weight_decay=0.1, seed=0,
                      data_seed=1)


def char_lm_config(**overrides) -> DecoderLMConfig:
    """:data:`MODEL_CONFIG` as a :class:`DecoderLMConfig`, with overrides.
    """
    return DecoderLMConfig(**{**MODEL_CONFIG, **overrides})


def train_char_lm(*, steps: int, batch_size: int, length: int, lr: float,
                  warmup_steps: int, weight_decay: float, seed: int,
                  data_seed: int, eval_every: int = 0,
                  eval_chars: int = 8192, progress: bool = False,
                  **config_overrides) -> tuple[DecoderLM, History]:
    r"""Train a character model on the manual's training topics.

    Batches: :func:`~course_lib.tasks.text_corpus.char_batches` of the training
    text (``data_seed``). ``seed`` sets the initialisation and the dropout
    stream. With ``eval_every`` the history records the validation loss
    in nats per character (:func:`bits_per_char` times $\ln 2$) on the
    first ``eval_chars`` validation characters.

    Returns:
        ``(model in eval mode, History)``.
    """
    for name, value in (("steps", steps), ("batch_size", batch_size),
                        ("length", length), ("eval_chars", eval_chars)):
        check_int(name, value, minimum=1)
    for name, value in (("warmup_steps", warmup_steps), ("seed", seed),
                        ("data_seed", data_seed),
                        ("eval_every", eval_every)):
        check_int(name, value, minimum=0)
    check_real("lr", lr, positive=True)
    check_real("weight_decay", weight_decay)
    check_bool("progress", progress)
    corpus = load_pydoc_corpus()
    vocab = CharVocab()
    train_ids = vocab.encode(corpus.train)
    val_ids = vocab.encode(corpus.val[:eval_chars])
    torch.manual_seed(seed)
    model = DecoderLM(char_lm_config(max_position_embeddings=length,
                                     **config_overrides))
    eval_fn = (lambda m: bits_per_char(m, val_ids, context=length)
               * math.log(2)) if eval_every else None
    history = train(model, char_batches(train_ids, batch_size=batch_size,
                                        length=length, seed=data_seed),
                    steps=steps, lr=lr, warmup_steps=warmup_steps,
                    schedule="cosine", weight_decay=weight_decay,
                    clip_norm=1.0, eval_fn=eval_fn, eval_every=eval_every,
                    seed=seed, progress=progress)
    return model.eval(), history


@torch.no_grad()
def bits_per_char(model: torch.nn.Module, ids: torch.Tensor, *,
                  context: int, start: int = 1) -> float:
    r"""Mean $-\log_2 q(x_t \mid x_{<t})$ over $t = s, \dots, N-1$.

    Every character but the first is predicted once, from at least
    ``context // 2`` and at most ``context`` preceding characters (fewer
    only near the start): windows of ``context`` characters start every
    ``context // 2`` positions, and each window scores only the targets
    that no earlier window scored (the first window scores all of its
    own). The model runs in eval mode; the mode is restored.

    Args:
        model: ``(B, T) -> (B, T, V)`` logits, ``T <= context``.
        ids: ``(N,)`` long, ``N >= 2``.
        context: the window length, at least 2.
        start: $s \ge 1$, the first target scored (earlier characters
            are still read as context); e.g. to score exactly the
            characters another model scores.
    """
    check_type("model", model, torch.nn.Module, "a torch.nn.Module")
    check_type("ids", ids, torch.Tensor, "a torch.Tensor")
    check_int("context", context, minimum=2)
    check_int("start", start, minimum=1)
    if ids.dim() != 1 or ids.dtype != torch.long or ids.numel() < 2:
        raise ValueError(f"ids must be a 1-d long tensor of at least 2 "
                         f"ids, got shape {tuple(ids.shape)} {ids.dtype}")
    if start >= ids.numel():
        raise ValueError(f"start must be < len(ids)={ids.numel()}, got "
                         f"{start}")
    stride, n = context // 2, ids.numel()
    windows, end, b = [], 0, 0     # end: last target index scored so far
    while end < n - 1:
        T = min(context, n - 1 - b)      # inputs ids[b:b+T], targets +1
        windows.append((b, T, end - b))  # local index of first new target
        end, b = b + T, b + stride
    was_training = model.training
    model.eval()
    total = 0.0
    try:
        for i in range(0, len(windows), 32):         # 32 windows a batch
            group = windows[i:i + 32]
            for T in sorted({w[1] for w in group}):  # only the last is short
                same = [w for w in group if w[1] == T]
                rows = torch.stack([ids[b:b + T + 1] for b, _, _ in same])
                logits = model(rows[:, :-1])                   # (B, T, V)
                nll = F.cross_entropy(logits.transpose(1, 2), rows[:, 1:],
                                      reduction="none")        # (B, T)
                for row, (b, _, first) in zip(nll, same):
                    first = max(first, start - 1 - b)   # global b + 1 + j
                    total += row[first:].double().sum().item()
    finally:
        model.train(was_training)
    return total / (n - start) / math.log(2)


def save_char_lm(path, model: DecoderLM, info: dict) -> None:
    """Save ``model``'s weights as float16 with its config and ``info``.
    """
    check_type("model", model, DecoderLM, "a DecoderLM")
    check_type("info", info, dict, "a dict")
    cfg = model.config
    config = {k: getattr(cfg, k) for k in MODEL_CONFIG}
    weights = {k: v.detach().to(torch.float16).clone()
               for k, v in model.state_dict().items()
               if k != "lm_head.weight" or not cfg.tie_word_embeddings}
    save_state_file(path, {"config": config, "weights": weights,
                           "info": info})


def _load_file(path) -> dict:
    return read_state_file(path, "char-LM checkpoint",
                           " (run `make checkpoints`)")


def load_char_lm(path=CHECKPOINT_PATH) -> tuple[DecoderLM, CharVocab]:
    """The trained character model (float32, eval mode) and its vocabulary.
    """
    state = _load_file(path)
    model = DecoderLM(DecoderLMConfig(**state["config"]))
    weights = {k: v.float() for k, v in state["weights"].items()}
    if model.config.tie_word_embeddings:
        weights["lm_head.weight"] = weights["embed_tokens.weight"]
    model.load_state_dict(weights)
    return model.eval(), CharVocab()


def load_char_lm_info(path=CHECKPOINT_PATH) -> dict:
    """What ``make checkpoints`` recorded: ``config``, the training
    settings, ``steps``, ``train_seconds``, ``load_average``, ``threads``,
    ``python_version``, ``val_bits_per_char`` (float16 weights, as
    loaded) and more; see ``scripts/train_char_lm.py``.
    """
    state = _load_file(path)
    config = DecoderLMConfig(**state["config"])
    return {"config": {k: getattr(config, k) for k in MODEL_CONFIG},
            **state["info"]}
