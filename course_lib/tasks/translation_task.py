r"""A toy translation task with a known answer, and its training recipe.

The source language is English-like, subject-verb-object
with adjectives before nouns: ``big cat sees small dog``. The target language
puts the verb last and adjectives after their nouns, and has its own words:
``CAT BIG DOG SMALL SEE``. Every source word has exactly one translation, so
the task is solved once a model has learned the lexicon and the reordering;
the reordering is what makes cross-attention interesting to look at. A share
of all sentences is held out, so greedy decoding is tested on combinations
the model never saw.

The recipes below train chapter 7's encoder-decoder on it with the one
training loop of :mod:`course_lib.training`.

Shape letters: B batch, S source length, T target length, V vocabulary.
"""
from __future__ import annotations

import itertools
import random
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from .._util.validation import check_batch, check_bool, check_int, check_type
from ..model.transformer import Transformer, TransformerConfig, greedy_decode
from ..training import IGNORE, History, train
from .special_tokens import BOS, EOS, PAD, SPECIALS

__all__ = ["translate", "TranslationTask", "make_translation_task",
           "collate_translation", "translation_batches", "seq2seq_loss",
           "TranslationRun", "translation_model", "train_toy_translation",
           "greedy_translate"]


# source word -> target word; the target words are the "foreign" lexicon
NOUNS = {"cat": "KATZE", "dog": "HUND", "bird": "VOGEL", "fish": "FISCH",
         "mouse": "MAUS", "horse": "PFERD"}
VERBS = {"sees": "SIEHT", "likes": "MAG", "chases": "JAGT",
         "bites": "BEISST", "finds": "FINDET"}
ADJECTIVES = {"big": "GROSS", "small": "KLEIN", "red": "ROT",
              "old": "ALT", "fast": "SCHNELL"}
LEXICON = {**NOUNS, **VERBS, **ADJECTIVES}


# ------------------------------------------------------------ translation
def translate(words: list[str]) -> list[str]:
    """The reference translation of a source sentence.

    ``[adj] noun verb [adj] noun`` becomes ``noun [adj] noun [adj] verb``
    with every word looked up in the lexicon: subject-object-verb order,
    adjectives after their nouns.
    """
    words = list(words)
    bad = ValueError(f"words must read '[adj] noun verb [adj] noun', "
                     f"got {' '.join(words)!r}")

    def phrase(i):            # "[adj] noun" at i -> ("NOUN [ADJ]", next i)
        adj = None
        if i < len(words) and words[i] in ADJECTIVES:
            adj, i = words[i], i + 1
        if i >= len(words) or words[i] not in NOUNS:
            raise bad
        return [LEXICON[words[i]]] + ([LEXICON[adj]] if adj else []), i + 1

    subject, i = phrase(0)
    if i >= len(words) or words[i] not in VERBS:
        raise bad
    verb = LEXICON[words[i]]
    obj, i = phrase(i + 1)
    if i != len(words):
        raise bad
    # subject - object - verb, adjectives after their nouns
    return subject + obj + [verb]


@dataclass(frozen=True)
class TranslationTask:
    """Vocabularies and the train/held-out split of the toy translation.

    ``train`` and ``held_out`` hold (source words, target words) pairs.
    Ids 0, 1, 2 are ``<pad>``, ``<bos>``, ``<eos>`` in both vocabularies.
    """

    src_vocab: list[str]
    tgt_vocab: list[str]
    train: list[tuple[list[str], list[str]]]
    held_out: list[tuple[list[str], list[str]]]

    def encode_src(self, words: list[str]) -> list[int]:
        """Source words -> ids, with ``<eos>`` appended."""
        return [self.src_vocab.index(w) for w in words] + [EOS]

    def encode_tgt(self, words: list[str]) -> list[int]:
        """Target words -> ids, wrapped in ``<bos>`` ... ``<eos>``."""
        return [BOS] + [self.tgt_vocab.index(w) for w in words] + [EOS]

    def decode_tgt(self, ids) -> list[str]:
        """Target ids -> words, stopping at ``<eos>``; specials dropped."""
        out = []
        for i in (ids.tolist() if isinstance(ids, torch.Tensor) else ids):
            if i == EOS:
                break
            if i not in (PAD, BOS):
                out.append(self.tgt_vocab[i])
        return out


def make_translation_task(*, held_out_fraction: float = 0.2,
                          seed: int = 0) -> TranslationTask:
    """All ``[adj] noun verb [adj] noun`` sentences, split at random.

    6 nouns x 6 adjective choices (5 or none), 5 verbs, again 6 x 6 for
    the object: 6480 sentences of 3 to 5 words.

    Args:
        held_out_fraction: share of sentences never used for training.
        seed: seed of the split.

    Returns:
        A :class:`TranslationTask`.
    """
    if not 0.0 < held_out_fraction < 1.0:
        raise ValueError(f"held_out_fraction must be in (0, 1), got "
                         f"{held_out_fraction}")
    phrases = [[n] if a is None else [a, n]
               for n in NOUNS for a in [None, *ADJECTIVES]]
    sentences = [s + [v] + o
                 for s, v, o in itertools.product(phrases, VERBS, phrases)]
    random.Random(seed).shuffle(sentences)
    n_held = round(held_out_fraction * len(sentences))
    pairs = [(s, translate(s)) for s in sentences]
    src_vocab = SPECIALS + list(NOUNS) + list(VERBS) + list(ADJECTIVES)
    tgt_vocab = SPECIALS + [LEXICON[w] for w in src_vocab[3:]]
    return TranslationTask(src_vocab, tgt_vocab, pairs[n_held:],
                           pairs[:n_held])


def collate_translation(task: TranslationTask, pairs):
    r"""Pad a list of pairs into the three tensors teacher forcing needs.

    The decoder reads ``tgt_in`` = ``<bos> y_1 ... y_n`` and must predict
    ``tgt_out`` = ``y_1 ... y_n <eos>``: the same sequence shifted by one.

    Returns:
        ``src`` (B, S), ``tgt_in`` (B, T), ``tgt_out`` (B, T), long, padded
        with ``PAD`` (``tgt_out`` with ``IGNORE``, which the loss skips).
    """
    if not pairs:
        raise ValueError("pairs must be a non-empty list, got 0 pairs")
    srcs = [task.encode_src(s) for s, _ in pairs]
    tgts = [task.encode_tgt(t) for _, t in pairs]
    S, T = max(map(len, srcs)), max(map(len, tgts)) - 1
    # Padded as Python lists, then one tensor each (one small tensor per
    # row cost as much as a tenth of a training step).
    src = torch.tensor([s + [PAD] * (S - len(s)) for s in srcs],
                       dtype=torch.long)
    tgt_in = torch.tensor([t[:-1] + [PAD] * (T + 1 - len(t)) for t in tgts],
                          dtype=torch.long)
    tgt_out = torch.tensor([t[1:] + [IGNORE] * (T + 1 - len(t))
                            for t in tgts], dtype=torch.long)
    return src, tgt_in, tgt_out


def translation_batches(task: TranslationTask, *, batch_size: int,
                        seed: int = 0):
    """Endless shuffled batches of training pairs (epoch after epoch).

    Each epoch is one shuffle of the training pairs cut into full batches
    (the last, partial batch of an epoch is skipped), so ``batch_size``
    may not exceed the number of training pairs: the arguments are checked
    here, before the first batch is asked for.

    Returns:
        An endless iterator of ``(src, tgt_in, tgt_out)`` from
        :func:`collate_translation`.
    """
    check_int("batch_size", batch_size, minimum=1)
    if batch_size > len(task.train):
        raise ValueError(f"batch_size must be <= the {len(task.train)} "
                         f"training pairs, got {batch_size}")
    return _epochs(task, batch_size, random.Random(seed))


def _epochs(task: TranslationTask, batch_size: int, rng: random.Random):
    order = list(range(len(task.train)))
    while True:
        rng.shuffle(order)
        for i in range(0, len(order) - batch_size + 1, batch_size):
            yield collate_translation(
                task, [task.train[j] for j in order[i:i + batch_size]])


# ------------------------------------------------------------ training recipe
def seq2seq_loss(model: nn.Module, batch) -> torch.Tensor:
    """Teacher-forced cross-entropy of an encoder-decoder on
    ``(src, tgt_in, tgt_out)``; padded source keys are masked.
    """
    check_batch("batch", batch, ("src", "tgt_in", "tgt_out"))
    src, tgt_in, tgt_out = batch
    logits = model(src, tgt_in,
                   src_lengths=(src != PAD).sum(1).tolist())  # (B, T, V)
    return F.cross_entropy(logits.flatten(0, 1), tgt_out.flatten(),
                           ignore_index=IGNORE)


class TranslationRun(NamedTuple):
    """Result of :func:`train_toy_translation`."""
    model: nn.Module                 # a trained Transformer, in eval mode
    history: History
    task: TranslationTask


def translation_model(task: TranslationTask, *, seed: int = 0
                      ) -> nn.Module:
    r"""Chapter 7's encoder-decoder, freshly initialised from ``seed``.

    The paper's post-norm :class:`~course_lib.model.transformer.Transformer` shrunk
    to $N = 2$, $D = 64$, 4 heads, $d_{ff} = 128$, dropout 0.1; separate
    source and target embeddings (the two languages share no words), the
    output projection tied to the target embedding.
    """
    check_type("task", task, TranslationTask, "a TranslationTask")
    torch.manual_seed(seed)
    model = Transformer(TransformerConfig(
        src_vocab_size=len(task.src_vocab),
        tgt_vocab_size=len(task.tgt_vocab), hidden_size=64,
        num_attention_heads=4, intermediate_size=128, num_hidden_layers=2,
        dropout=0.1, max_position_embeddings=16,
        share_src_tgt_embeddings=False))
    # Redraw the embeddings (same law). Transformer.__init__ once drew them
    # in a varying order; the redraw keeps the run recorded in chapter 7.
    for emb in (model.src_embed, model.tgt_embed):
        nn.init.normal_(emb.weight, std=model.config.hidden_size ** -0.5)
    return model


def train_toy_translation(*, seed: int = 0, steps: int = 200,
                          batch_size: int = 64, lr: float = 3e-3,
                          warmup_steps: int = 40, eval_every: int = 50,
                          progress: bool = False) -> TranslationRun:
    r"""Train chapter 7's encoder-decoder on the toy translation task.

    Model: :func:`translation_model`. The validation loss is measured on
    256 held-out sentences.
    """
    check_bool("progress", progress)
    task = make_translation_task(held_out_fraction=0.2, seed=0)
    val = collate_translation(task, task.held_out[:256])
    model = translation_model(task, seed=seed)
    history = train(model, translation_batches(task, batch_size=batch_size,
                                               seed=seed),
                    steps=steps, lr=lr, warmup_steps=warmup_steps,
                    schedule="cosine", weight_decay=0.01, clip_norm=1.0,
                    loss_fn=seq2seq_loss,
                    eval_fn=lambda m: seq2seq_loss(m, val).item(),
                    eval_every=eval_every, seed=seed, progress=progress)
    return TranslationRun(model.eval(), history, task)


def greedy_translate(model: nn.Module, task: TranslationTask,
                     sentences: list[list[str]]) -> list[list[str]]:
    """Translate source sentences with :func:`~course_lib.model.transformer.
    greedy_decode`; returns target word lists (EOS and after dropped).
    """
    check_type("task", task, TranslationTask, "a TranslationTask")
    src = collate_translation(task, [(s, []) for s in sentences])[0]
    ids = greedy_decode(model, src, max_len=src.shape[1] + 2, bos_id=BOS,
                        eos_id=EOS, src_lengths=(src != PAD).sum(1).tolist())
    return [task.decode_tgt(row[1:]) for row in ids]        # drop BOS
