r"""Real text that every Python has: the reference manual in ``pydoc_data``.

The standard library ships the text of the Python language reference
that ``help("for")`` prints: ``pydoc_data.topics.topics``, a dict from a
topic name (``"for"``, ``"assignment"``, ``"typesseq"``, ...) to its
text, about 465,000 characters of English prose, grammar rules and code
examples. Nothing has to be downloaded, and the text is fixed for a given
Python version (the corpus records it: outputs computed on it are
reproducible under one pinned Python).

Tokens are **characters**. A character vocabulary is tiny (96 symbols
here), needs no training, and every string maps to ids and back without
an unknown token; the price is long sequences (about four characters per
BPE token of English), which a small model of a few hundred characters of
context can afford. Chapter 13 shows BPE.

Shape letters: B batch, T length (characters).
"""
from __future__ import annotations

import platform
from dataclasses import dataclass

import torch

from .._util.validation import check_alloc, check_int, check_type

__all__ = ["PRINTABLE", "PLACEHOLDER", "normalize_text", "PydocCorpus",
           "load_pydoc_corpus", "CharVocab", "char_batches"]

#: The fixed alphabet: newline and the 95 printable ASCII characters.
PRINTABLE = "\n" + "".join(chr(c) for c in range(32, 127))
#: What any other character becomes after :data:`_TRANSLIT`.
PLACEHOLDER = "?"
# Typographic characters of the manual, written as ASCII.
_TRANSLIT = {"\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"',
             "\u2026": "...", "\u2014": "--", "\u2013": "-", "\t": "    "}


def normalize_text(text: str) -> str:
    """Map ``text`` onto :data:`PRINTABLE`.

    Curly quotes become straight ones, the ellipsis ``...``, the dashes
    ``--`` and ``-``, a tab four spaces; every other character outside
    :data:`PRINTABLE` becomes :data:`PLACEHOLDER` ``"?"`` (in Python
    3.11.7's manual: 2 ``"ß"`` and 1 ``"°"``, out of 465,000).
    """
    check_type("text", text, str, "a str")
    allowed = set(PRINTABLE)
    return "".join(c if c in allowed else _TRANSLIT.get(c, PLACEHOLDER)
                   for c in text)


@dataclass(frozen=True)
class PydocCorpus:
    """Train and validation text of :func:`load_pydoc_corpus`."""
    train: str
    val: str
    python_version: str            # e.g. "3.11.7": the text depends on it
    n_topics_train: int
    n_topics_val: int
    val_topics: tuple[str, ...] = ()


def load_pydoc_corpus() -> PydocCorpus:
    r"""The reference manual of this Python, split **by topic**.

    Topics are sorted by name; topic $i$ (0-based) goes to validation if
    $i \bmod 10 = 0$, else to training (Python 3.11.7: 71 training topics,
    8 validation topics, about 93 % and 7 % of the characters). Within a
    side, topics are joined in sorted order, separated by a blank line.

    Why by topic and not by position or at random: the characters of one
    topic are strongly dependent (the same keywords, grammar rules and
    examples recur inside it). Validation characters drawn from the same
    topics as training ones would measure how well the model remembers
    those topics, not how it predicts new text. A split by sorted name is
    deterministic, needs no random generator and keeps every topic whole
    on one side.

    Text is normalised by :func:`normalize_text`, so every character is
    in :data:`PRINTABLE`.
    """
    from pydoc_data.topics import topics  # a dict: topic name -> text
    names = sorted(topics)
    val_names = [n for i, n in enumerate(names) if i % 10 == 0]
    train_names = [n for i, n in enumerate(names) if i % 10 != 0]

    def join(keys):
        return "\n\n".join(normalize_text(topics[k]).strip("\n")
                           for k in keys) + "\n"
    return PydocCorpus(train=join(train_names), val=join(val_names),
                       python_version=platform.python_version(),
                       n_topics_train=len(train_names),
                       n_topics_val=len(val_names),
                       val_topics=tuple(val_names))


class CharVocab:
    r"""Characters <-> ids: id $i$ is ``chars[i]``.

    ``CharVocab()`` uses the fixed alphabet :data:`PRINTABLE` (96
    characters, the vocabulary of the course's character model);
    :meth:`from_text` uses the sorted characters of a text.
    """

    def __init__(self, chars: str = PRINTABLE) -> None:
        check_type("chars", chars, str, "a str")
        if not chars or len(set(chars)) != len(chars):
            raise ValueError(f"chars must be a non-empty str of distinct "
                             f"characters, got {chars[:40]!r}")
        self.chars = chars
        self._index = {c: i for i, c in enumerate(chars)}

    @classmethod
    def from_text(cls, text: str) -> "CharVocab":
        """The vocabulary of the distinct characters of ``text``, sorted."""
        check_type("text", text, str, "a str")
        if not text:
            raise ValueError("text must not be empty")
        return cls("".join(sorted(set(text))))

    @property
    def size(self) -> int:
        """$V$, the number of characters."""
        return len(self.chars)

    def __len__(self) -> int:
        return len(self.chars)

    def __repr__(self) -> str:
        return f"CharVocab(size={self.size})"

    def encode(self, text: str) -> torch.Tensor:
        """``text`` -> ``(T,)`` long ids. A character outside the
        vocabulary is a ``ValueError`` (normalise the text first)."""
        check_type("text", text, str, "a str")
        try:
            return torch.tensor([self._index[c] for c in text],
                                dtype=torch.long)
        except KeyError as err:
            raise ValueError(
                f"text holds {err.args[0]!r}, which is not in the "
                f"vocabulary of {self.size} characters (use "
                f"normalize_text first)") from None

    def decode(self, ids) -> str:
        """``(T,)`` ids (a tensor or a list of ints) -> text."""
        if isinstance(ids, torch.Tensor):
            if ids.dim() != 1 or ids.dtype.is_floating_point or \
                    ids.dtype == torch.bool:
                raise ValueError(f"ids must be a 1-d integer tensor, got "
                                 f"{ids.dim()}-d {ids.dtype}")
            ids = ids.tolist()
        check_type("ids", ids, (list, tuple), "a 1-d tensor or a list")
        bad = [i for i in ids if type(i) is not int or not
               0 <= i < self.size]
        if bad:
            raise ValueError(f"ids must be ints in [0, {self.size}), got "
                             f"{bad[0]!r}")
        return "".join(self.chars[i] for i in ids)


def char_batches(ids: torch.Tensor, *, batch_size: int, length: int,
                 seed: int = 0):
    r"""Endless batches of random windows of a character stream.

    Each row is a window $x_s, \dots, x_{s+T}$ of ``ids`` with a uniform
    random start $s$; inputs are its first $T$ ids, targets its last $T$
    (the next character at every position). Windows are drawn with
    replacement from a ``torch.Generator`` seeded with ``seed``, so the
    stream is the same on every run. Same format as
    :func:`course_lib.tasks.markov.lm_batches`, which
    :func:`course_lib.training.train` consumes.

    Args:
        ids: ``(N,)`` long, ``N > length``.

    Yields:
        ``(inputs, targets)``, both ``(B, T)`` long, ``T = length``.
    """
    check_type("ids", ids, torch.Tensor, "a torch.Tensor")
    check_int("batch_size", batch_size, minimum=1)
    check_int("length", length, minimum=1)
    if ids.dim() != 1 or ids.dtype != torch.long:
        raise ValueError(f"ids must be a 1-d long tensor, got "
                         f"{ids.dim()}-d {ids.dtype}")
    if ids.numel() <= length:
        raise ValueError(f"ids must be longer than length={length}, got "
                         f"{ids.numel()} ids")
    check_alloc("batch_size * (length + 1)", batch_size * (length + 1))
    return _windows(ids, batch_size, length, seed)


def _windows(ids, batch_size, length, seed):
    gen = torch.Generator().manual_seed(seed)
    offsets = torch.arange(length + 1)                       # (T + 1,)
    while True:
        starts = torch.randint(0, ids.numel() - length, (batch_size,),
                               generator=gen)                # (B,)
        rows = ids[starts[:, None] + offsets]                # (B, T + 1)
        yield rows[:, :-1], rows[:, 1:]
