r"""Two tasks with known answers: a toy translation, a synthetic language.

**Toy translation.** The source language is English-like, subject-verb-object
with adjectives before nouns: ``big cat sees small dog``. The target language
puts the verb last and adjectives after their nouns, and has its own words:
``CAT BIG DOG SMALL SEE``. Every source word has exactly one translation, so
the task is solved once a model has learned the lexicon and the reordering;
the reordering is what makes cross-attention interesting to look at. A share
of all sentences is held out, so greedy decoding is tested on combinations
the model never saw.

**Synthetic language.** Symbols are drawn by a Markov chain of order $k$
over $V$ symbols: the next symbol depends on the last $k$ only,
$p(x_t \mid x_{<t}) = P[c_t, x_t]$ with context $c_t = (x_{t-k}, \dots,
x_{t-1})$. Each context allows only a few successors, with random
probabilities. For a stationary chain the entropy rate is exact,

$$h = \sum_{c} \pi(c)\, H\big(P[c, \cdot]\big)
    = -\sum_{c} \pi(c) \sum_{x} P[c, x] \log P[c, x] \quad\text{nats},$$

where $\pi$ is the stationary distribution over contexts. No model can have
a lower expected cross-entropy per token, so $h$ is the floor for the
validation loss of a language model trained on this process.

Shape letters: B batch, S source length, T target or sequence length,
V vocabulary (number of symbols), C number of contexts ($V^k$).

Introduced in chapter 7.
"""
from __future__ import annotations

import itertools
import math
import random
from dataclasses import dataclass

import torch

from .validation import check_int

__all__ = ["PAD", "BOS", "EOS", "IGNORE", "SPECIALS", "TranslationTask",
           "translate", "make_translation_task", "collate_translation",
           "translation_batches", "MarkovSource", "random_markov_source",
           "stationary_distribution", "entropy_rate", "sample_markov",
           "token_nll", "lm_batches"]

PAD, BOS, EOS = 0, 1, 2          # the same ids in both vocabularies
SPECIALS = ["<pad>", "<bos>", "<eos>"]
IGNORE = -100                    # target id skipped by F.cross_entropy

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

    Introduced in chapter 7.
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

    Introduced in chapter 7.
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

    Introduced in chapter 7.
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

    Introduced in chapter 7.
    """
    if not pairs:
        raise ValueError("pairs must be a non-empty list, got 0 pairs")
    srcs = [task.encode_src(s) for s, _ in pairs]
    tgts = [task.encode_tgt(t) for _, t in pairs]
    S, T = max(map(len, srcs)), max(map(len, tgts)) - 1
    src = torch.full((len(pairs), S), PAD, dtype=torch.long)
    tgt_in = torch.full((len(pairs), T), PAD, dtype=torch.long)
    tgt_out = torch.full((len(pairs), T), IGNORE, dtype=torch.long)
    for b, (s, t) in enumerate(zip(srcs, tgts)):
        src[b, :len(s)] = torch.tensor(s)
        tgt_in[b, :len(t) - 1] = torch.tensor(t[:-1])
        tgt_out[b, :len(t) - 1] = torch.tensor(t[1:])
    return src, tgt_in, tgt_out


def translation_batches(task: TranslationTask, *, batch_size: int,
                        seed: int = 0):
    """Endless shuffled batches of training pairs (epoch after epoch).

    Yields:
        ``(src, tgt_in, tgt_out)`` from :func:`collate_translation`.

    Introduced in chapter 7.
    """
    check_int("batch_size", batch_size, minimum=1)
    rng = random.Random(seed)
    order = list(range(len(task.train)))
    while True:
        rng.shuffle(order)
        for i in range(0, len(order) - batch_size + 1, batch_size):
            yield collate_translation(
                task, [task.train[j] for j in order[i:i + batch_size]])


# ------------------------------------------------------ synthetic language
@dataclass(frozen=True)
class MarkovSource:
    r"""A Markov chain of order $k$ over $V$ symbols.

    ``probs[c, x]`` is $P[c, x] = p(x_t = x \mid c_t = c)$; the context
    $c = (x_{t-k}, \dots, x_{t-1})$ is numbered in base $V$ with the
    oldest symbol as the leading digit. ``symbols`` names the ids.

    Introduced in chapter 7.
    """

    vocab_size: int
    order: int
    probs: torch.Tensor              # (C, V), float64, rows sum to 1
    symbols: str

    def context_ids(self, seqs: torch.Tensor) -> torch.Tensor:
        """``(B, T)`` symbols -> ``(B, T - k + 1)`` ids of every window."""
        windows = seqs.unfold(1, self.order, 1)          # (B, T-k+1, k)
        weights = self.vocab_size ** torch.arange(self.order - 1, -1, -1)
        return (windows * weights).sum(-1)               # (B, T-k+1)

    def decode(self, ids) -> str:
        """Symbol ids -> a string of letters."""
        ids = ids.tolist() if isinstance(ids, torch.Tensor) else ids
        return "".join(self.symbols[i] for i in ids)


def _transition_matrix(source: MarkovSource) -> torch.Tensor:
    """(C, C) chain over contexts: c = (.., a, b) -> c' = (.., b, x)."""
    C, V = source.probs.shape
    nxt = (torch.arange(C)[:, None] * V) % C + torch.arange(V)   # (C, V)
    M = torch.zeros(C, C, dtype=torch.float64)
    M.scatter_add_(1, nxt, source.probs)
    return M


def stationary_distribution(source: MarkovSource) -> torch.Tensor:
    r"""The stationary distribution $\pi$ over contexts, $\pi M = \pi$.

    $M$ is the chain over contexts; $\pi$ is its left eigenvector for
    eigenvalue 1 with $\sum_c \pi(c) = 1$, solved as a linear system in
    float64; it is unique because the chain has one recurrent class (see
    :func:`random_markov_source`).

    Returns:
        ``(C,)`` float64, sums to 1.

    Introduced in chapter 7.
    """
    M = _transition_matrix(source)                           # (C, C)
    C = M.shape[0]
    # pi (M - I) = 0 has a one-dimensional solution space; replacing one
    # equation by sum(pi) = 1 makes the system regular.
    A = (M - torch.eye(C, dtype=torch.float64)).T            # (C, C)
    A[-1] = 1.0
    rhs = torch.zeros(C, dtype=torch.float64)
    rhs[-1] = 1.0
    pi = torch.linalg.solve(A, rhs)                          # (C,)
    # exact zeros on transient contexts are tiny negatives after rounding
    pi = pi.clamp(min=0.0)
    return pi / pi.sum()


def entropy_rate(source: MarkovSource) -> float:
    r"""Exact entropy rate $h = \sum_c \pi(c) H(P[c, \cdot])$ in nats.

    Introduced in chapter 7.
    """
    P = source.probs
    # H(P[c, .]) = -sum_x P log P, with 0 log 0 = 0
    per_context = -(P * torch.where(P > 0, P.log(), 0.0)).sum(-1)  # (C,)
    return float(stationary_distribution(source) @ per_context)


def random_markov_source(*, vocab_size: int = 16, order: int = 2,
                         branching: int = 3, concentration: float = 1.0,
                         seed: int = 0) -> MarkovSource:
    r"""A random sparse Markov chain with a unique stationary distribution.

    Each of the $V^k$ contexts gets ``branching`` distinct successors with
    probabilities from a Dirichlet(``concentration``) draw. Some contexts
    may be transient (no context leads to them; $\pi = 0$ there). A draw
    whose recurrent contexts do not form one aperiodic class (every
    context must reach every recurrent context in exactly $n$ steps for
    large $n$) is rejected and redrawn, so the stationary distribution
    is unique and long samples are ergodic.

    Introduced in chapter 7.
    """
    check_int("vocab_size", vocab_size, minimum=2)
    check_int("order", order, minimum=1)
    check_int("branching", branching, minimum=1)
    if branching > vocab_size:
        raise ValueError(f"branching must be <= vocab_size={vocab_size}, "
                         f"got {branching}")
    if vocab_size > 26 or vocab_size ** order > 1024:
        raise ValueError(f"vocab_size must be <= 26 (one letter each) and "
                         f"vocab_size ** order <= 1024 contexts, got "
                         f"vocab_size={vocab_size}, order={order}")
    if not concentration > 0:
        raise ValueError(f"concentration must be > 0, got {concentration}")
    C = vocab_size ** order
    symbols = "abcdefghijklmnopqrstuvwxyz"[:vocab_size]
    dirichlet = torch.distributions.Dirichlet(
        torch.full((C, branching), float(concentration), dtype=torch.float64))
    # A private RNG stream: the caller's global state is left untouched.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for _ in range(100):
            succ = torch.rand(C, vocab_size).argsort(-1)[:, :branching]
            probs = torch.zeros(C, vocab_size, dtype=torch.float64)
            probs.scatter_(1, succ, dirichlet.sample())           # (C, V)
            source = MarkovSource(vocab_size, order, probs, symbols)
            reach = (_transition_matrix(source) > 0).double()
            # Squaring j times gives the pattern of M^(2^j); 2^j >= C^2 + C
            # exceeds Wielandt's bound (C-1)^2 + 1 plus C transient steps.
            for _ in range(math.ceil(math.log2(C * C + C))):
                reach = ((reach @ reach) > 0).double()
            # Primitive on its recurrent contexts: from every context, after
            # many steps, every recurrent context is reachable (a column of
            # all ones) and no transient one is (a column of zeros).
            cols = reach.sum(0)                                  # (C,)
            if bool(((cols == C) | (cols == 0)).all()):
                return source
    raise ValueError("no primitive chain found; increase branching")


def sample_markov(source: MarkovSource, *, n_sequences: int, length: int,
                  generator: torch.Generator | None = None) -> torch.Tensor:
    r"""Sample sequences from the stationary chain.

    The first context is drawn from $\pi$, so every position of every
    sequence has the stationary distribution (no burn-in needed).

    Returns:
        ``(B, T)`` long symbol ids, ``T = length >= order``.

    Introduced in chapter 7.
    """
    check_int("n_sequences", n_sequences, minimum=1)
    check_int("length", length, minimum=source.order)
    V, k = source.vocab_size, source.order
    C = V ** k
    pi = stationary_distribution(source)
    ctx = torch.multinomial(pi, n_sequences, replacement=True,
                            generator=generator)             # (B,)
    seqs = torch.empty(n_sequences, length, dtype=torch.long)
    for j in range(k):                    # digits of the first context
        seqs[:, j] = ctx // V ** (k - 1 - j) % V
    cdf = source.probs.cumsum(-1)                            # (C, V)
    # From the last allowed symbol on the CDF must be exactly 1, or a
    # rounding gap below 1 could select a forbidden symbol.
    tail = source.probs.flip(-1).cumsum(-1).flip(-1) - source.probs
    cdf[tail == 0] = 1.0
    u = torch.rand(n_sequences, length, generator=generator,
                   dtype=torch.float64)                      # (B, T)
    for t in range(k, length):
        # inverse-CDF sampling: x = number of CDF entries <= u
        x = (cdf[ctx] <= u[:, t, None]).sum(-1)              # (B,)
        seqs[:, t] = x
        ctx = (ctx * V) % C + x           # drop the oldest symbol
    return seqs


def token_nll(source: MarkovSource, seqs: torch.Tensor) -> torch.Tensor:
    r"""True $-\log p(x_t \mid c_t)$ of every predictable token, in nats.

    Args:
        seqs: ``(B, T)`` symbol ids.

    Returns:
        ``(B, T - k)`` float64: the loss of the ideal model on tokens
        $t = k, \dots, T-1$; ``inf`` where the chain forbids a token.

    Introduced in chapter 7.
    """
    if seqs.dim() != 2 or seqs.shape[1] <= source.order:
        raise ValueError(f"seqs must have shape (B, T) with T > order="
                         f"{source.order}, got {tuple(seqs.shape)}")
    ctx = source.context_ids(seqs[:, :-1])                   # (B, T-k)
    p = source.probs[ctx, seqs[:, source.order:]]            # (B, T-k)
    return -p.log()


def lm_batches(source: MarkovSource, *, batch_size: int, length: int,
               seed: int = 0):
    """Endless fresh batches for next-token prediction.

    Each sequence has ``length + 1`` symbols; inputs are the first
    ``length``, targets the last ``length``. The first ``order - 1``
    targets are set to ``IGNORE``: they lack a full context, so their
    best possible loss is above the entropy rate.

    Yields:
        ``(inputs, targets)``, both ``(B, length)`` long.

    Introduced in chapter 7.
    """
    check_int("batch_size", batch_size, minimum=1)
    check_int("length", length, minimum=source.order)
    gen = torch.Generator().manual_seed(seed)
    while True:
        seqs = sample_markov(source, n_sequences=batch_size,
                             length=length + 1, generator=gen)
        targets = seqs[:, 1:].clone()
        targets[:, :source.order - 1] = IGNORE
        yield seqs[:, :-1], targets
