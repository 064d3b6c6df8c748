r"""Byte-level byte-pair encoding (BPE), written out in plain Python.

A BPE tokenizer (Sennrich et al. 2016; byte-level since GPT-2, Radford
et al. 2019) turns text into ids in three steps:

1. **Pre-tokenize**: cut the text into *words* with a regex, so that no
   token ever spans, say, a letter and a following space-less digit.
   SmolLM2 first isolates every digit, then applies GPT-2's pattern
   (:data:`GPT2_PATTERN`): contractions, ``" ?letters"``,
   ``" ?numbers"``, ``" ?other symbols"`` and whitespace runs.
2. **Bytes to symbols**: each word's UTF-8 bytes are written with
   GPT-2's map of the 256 byte values to 256 printable characters
   (:func:`bytes_to_unicode`; a space becomes ``"Ġ"``), so any text,
   emoji included, is a string over a 256-letter alphabet and nothing is
   ever out of vocabulary.
3. **Merge**: start from single symbols and repeatedly merge the
   adjacent pair with the lowest *rank* $r(a, b)$, its position in the
   learned merge list (learned first = most frequent), until no adjacent
   pair is in the list:

$$(a, b)^{*} = \arg\min_{(a, b)\ \text{adjacent}} r(a, b).$$

Each final symbol is a vocabulary entry, and its position in the
vocabulary is its id. Special tokens (``<|im_start|>``) are cut out of
the text before step 1 and map to their ids directly.
:class:`~course_lib.pretrained.tokenizer.ByteLevelBPETokenizer` runs the same
algorithm in Rust; both give the same ids.
"""
from __future__ import annotations

import functools

import regex  # like re, plus Unicode classes: \p{L} letter, \p{N} number

from .._util.validation import check_bool, check_type

__all__ = ["GPT2_PATTERN", "bytes_to_unicode", "pretokenize", "BPE"]

# GPT-2's pre-tokenizer (the one in tokenizers' ByteLevel): contractions,
# optional space + letters / numbers / other symbols, then whitespace;
# \s+(?!\S) leaves the last space of a run to the word that follows.
GPT2_PATTERN = regex.compile(
    r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+"""
    r"""|\s+(?!\S)|\s+""")
DIGIT = regex.compile(r"\p{N}")


@functools.lru_cache(maxsize=1)
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's map byte value -> printable character.

    The 188 bytes that are printable Latin-1 characters (``!`` to ``~``,
    ``¡`` to ``¬``, ``®`` to ``ÿ``) stand for themselves; the other 68
    (control characters, space, ...) get the characters 256, 257, ... in
    order, so byte 32 (space) is ``"Ġ"`` (U+0120) and byte 10 (newline)
    is ``"Ċ"``.
    """
    keep = (list(range(ord("!"), ord("~") + 1))
            + list(range(ord("¡"), ord("¬") + 1))
            + list(range(ord("®"), ord("ÿ") + 1)))
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def pretokenize(text: str, *, split_digits: bool = True) -> list[str]:
    r"""Cut ``text`` into words: every digit alone (SmolLM2, with
    ``split_digits``), then :data:`GPT2_PATTERN` inside each piece.
    """
    check_type("text", text, str, "a str")
    check_bool("split_digits", split_digits)
    pieces, start = [], 0
    if split_digits:
        for m in DIGIT.finditer(text):          # "a12" -> "a", "1", "2"
            pieces += [text[start:m.start()], m.group()]
            start = m.end()
    pieces.append(text[start:])
    return [w for p in pieces if p for w in GPT2_PATTERN.findall(p)]


class BPE:
    """Byte-level BPE encoder over a vocabulary and a merge list.

    Args:
        tokens: the vocabulary, id -> token string (byte-level alphabet).
        merges: ``"a b"`` strings, lowest rank (first learned) first.
        special_tokens: strings matched whole in the text (e.g.
            ``"<|im_start|>"``); they must be in ``tokens``.
        split_digits: isolate digits before the GPT-2 regex (SmolLM2).
    """

    def __init__(self, tokens: list[str], merges: list[str], *,
                 special_tokens: list[str] = (),
                 split_digits: bool = True) -> None:
        check_type("tokens", tokens, list, "a list")
        if not tokens:
            raise ValueError("tokens must be a non-empty list, got []")
        check_bool("split_digits", split_digits)
        if not isinstance(merges, list) or \
                not all(isinstance(m, str) for m in merges):
            raise TypeError("merges must be a list of 'a b' strings, got "
                            f"{type(merges).__name__}")
        self.vocab = {t: i for i, t in enumerate(tokens)}     # token -> id
        self.tokens = tokens
        # rank of each pair: its position in the merge list
        self.ranks = {tuple(m.split(" ")): r for r, m in enumerate(merges)}
        missing = [t for t in special_tokens if t not in self.vocab]
        if missing:
            raise ValueError(f"special_tokens must be in tokens, got "
                             f"{missing[:3]}")
        self.special_tokens = list(special_tokens)
        # longest first, so that no special token matches inside another
        alternatives = sorted(special_tokens, key=len, reverse=True)
        self._special = regex.compile("|".join(
            regex.escape(t) for t in alternatives)) if alternatives else None
        self.split_digits = split_digits
        self.byte_map = bytes_to_unicode()
        self.byte_unmap = {c: b for b, c in self.byte_map.items()}
        self._cache: dict[str, tuple[int, ...]] = {}

    def to_symbols(self, word: str) -> str:
        """A word's UTF-8 bytes in the byte-level alphabet."""
        return "".join(self.byte_map[b] for b in word.encode("utf-8"))

    def merge_steps(self, word: str) -> list[list[str]]:
        """Every segmentation of ``word`` on the way: first its single
        byte symbols, then one line per merge, last the final tokens.
        ``word`` is plain text (one pre-tokenized word, e.g. ``" hello"``).
        """
        if not isinstance(word, str) or not word:
            raise ValueError(f"word must be a non-empty str, got {word!r}")
        parts = list(self.to_symbols(word))
        steps = [parts]
        while len(parts) > 1:
            # the adjacent pair with the lowest rank (leftmost on a tie)
            rank, i = min((self.ranks.get(pair, float("inf")), i)
                          for i, pair in enumerate(zip(parts, parts[1:])))
            if rank == float("inf"):
                break                       # no adjacent pair is a merge
            parts = parts[:i] + [parts[i] + parts[i + 1]] + parts[i + 2:]
            steps.append(parts)
        return steps

    def _word_ids(self, word: str) -> tuple[int, ...]:
        if word not in self._cache:        # words repeat: merge each once
            self._cache[word] = tuple(self.vocab[t]
                                      for t in self.merge_steps(word)[-1])
        return self._cache[word]

    def encode(self, text: str) -> list[int]:
        """``text`` -> ids: special tokens, else pre-tokenize and merge."""
        check_type("text", text, str, "a str")
        ids, start = [], 0
        matches = self._special.finditer(text) if self._special else ()
        for m in list(matches) + [None]:
            chunk = text[start:m.start() if m else len(text)]
            for word in pretokenize(chunk, split_digits=self.split_digits):
                ids.extend(self._word_ids(word))
            if m:
                ids.append(self.vocab[m.group()])
                start = m.end()
        return ids

    def decode(self, ids: list[int]) -> str:
        """ids -> text: tokens joined, symbols back to bytes, UTF-8."""
        if not isinstance(ids, list) or not all(
                isinstance(i, int) and 0 <= i < len(self.tokens)
                for i in ids):
            raise ValueError(f"ids must be a list of ints in [0, "
                             f"{len(self.tokens)}), got {ids!r:.80}")
        out = bytearray()
        for i in ids:
            t = self.tokens[i]
            if t in self.special_tokens:
                out += t.encode("utf-8")
            else:
                out += bytes(self.byte_unmap[c] for c in t)
        return out.decode("utf-8", errors="replace")
