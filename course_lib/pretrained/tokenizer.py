r"""The fast tokenizer of a GGUF model: byte-level BPE on Hugging Face's
``tokenizers`` library, and the chat template.

A GGUF file carries its tokenizer as metadata: the vocabulary
(``tokenizer.ggml.tokens``, id = position in the list), the merges
(``tokenizer.ggml.merges``, best first), each token's type (3 = control,
e.g. ``<|im_start|>``), the bos/eos/pad/unk ids and the chat template (a
Jinja2 program). ``tokenizer.ggml.pre`` names the *pre-tokenizer*, the
rule that cuts text into words before BPE runs inside each word. For
SmolLM2 (``"smollm"``) it is the one of its original ``tokenizer.json``
and of llama.cpp: every digit on its own (``Digits(individual_digits=
True)``), then GPT-2's regex and byte-to-unicode map (``ByteLevel``).
:mod:`course_lib.pretrained.bpe` writes the same algorithm in plain Python.
"""
from __future__ import annotations

__all__ = ["CONTROL", "ByteLevelBPETokenizer"]

CONTROL = 3                 # llama.cpp token type of special tokens


class ByteLevelBPETokenizer:
    """Byte-level BPE from a GGUF file's vocabulary and merges.

    ``encode`` adds no special tokens, but special-token strings written
    in the text (``"<|im_start|>"``) map to their single ids.

    Args:
        tokens: the vocabulary, id -> token string (byte-level alphabet).
        merges: ``"a b"`` strings, best (lowest rank) first.
        token_types: one llama.cpp type per token (3 = control).
        bos_id, eos_id, pad_id, unk_id: special ids (None if absent).
        chat_template: Jinja2 source, or None.
        pre: pre-tokenizer name from ``tokenizer.ggml.pre``.
    """

    def __init__(self, *, tokens: list[str], merges: list[str],
                 token_types: list[int], bos_id: int | None = None,
                 eos_id: int | None = None, pad_id: int | None = None,
                 unk_id: int | None = None,
                 chat_template: str | None = None,
                 pre: str = "smollm") -> None:
        from tokenizers import (
            AddedToken,
            Tokenizer,
            decoders,
            models,
            pre_tokenizers,
        )
        if not isinstance(tokens, list) or not tokens:
            raise ValueError(f"tokens must be a non-empty list of strings, "
                             f"got {type(tokens).__name__}")
        if not isinstance(token_types, list) \
                or len(token_types) != len(tokens):
            raise ValueError(f"token_types must be a list of "
                             f"{len(tokens)} ints (one per token), got "
                             f"{len(token_types) if isinstance(token_types, list) else type(token_types).__name__}")
        if not isinstance(merges, list) or \
                not all(isinstance(m, str) for m in merges):
            raise TypeError("merges must be a list of 'a b' strings, got "
                            f"{type(merges).__name__}")
        if pre not in ("smollm", "gpt2"):
            raise ValueError(f"pre must be 'smollm' or 'gpt2', got {pre!r}")
        for name, i in (("bos_id", bos_id), ("eos_id", eos_id),
                        ("pad_id", pad_id), ("unk_id", unk_id)):
            if i is not None and not 0 <= i < len(tokens):
                raise ValueError(f"{name} must be in [0, {len(tokens)}), "
                                 f"got {i}")
        self.tokens, self.token_types = tokens, token_types
        self.bos_id, self.eos_id = bos_id, eos_id
        self.pad_id, self.unk_id = pad_id, unk_id
        self.chat_template = chat_template
        self.special_tokens = [t for t, k in zip(tokens, token_types)
                               if k == CONTROL]
        vocab = {t: i for i, t in enumerate(tokens)}
        pairs = [tuple(m.split(" ")) for m in merges]
        backend = Tokenizer(models.BPE(vocab=vocab, merges=pairs))
        split = [pre_tokenizers.ByteLevel(add_prefix_space=False,
                                          use_regex=True)]
        if pre == "smollm":
            # digits one by one first: '2024' never becomes one word
            split.insert(0, pre_tokenizers.Digits(individual_digits=True))
        backend.pre_tokenizer = pre_tokenizers.Sequence(split)
        backend.decoder = decoders.ByteLevel()
        backend.add_special_tokens([AddedToken(t, special=True,
                                               normalized=False)
                                    for t in self.special_tokens])
        self.backend = backend

    @classmethod
    def from_gguf(cls, metadata: dict) -> "ByteLevelBPETokenizer":
        """Build from a GGUF file's metadata (``GGUFFile.metadata``)."""
        kind = metadata.get("tokenizer.ggml.model") \
            if isinstance(metadata, dict) else None
        if kind != "gpt2":
            raise ValueError(f"metadata must describe a byte-level BPE "
                             f"(tokenizer.ggml.model='gpt2'), got {kind!r}")
        g = "tokenizer.ggml."
        return cls(tokens=metadata[g + "tokens"],
                   merges=metadata[g + "merges"],
                   token_types=metadata[g + "token_type"],
                   bos_id=metadata.get(g + "bos_token_id"),
                   eos_id=metadata.get(g + "eos_token_id"),
                   pad_id=metadata.get(g + "padding_token_id"),
                   unk_id=metadata.get(g + "unknown_token_id"),
                   chat_template=metadata.get("tokenizer.chat_template"),
                   pre=metadata.get(g + "pre", "gpt2"))

    def __repr__(self) -> str:
        return (f"ByteLevelBPETokenizer(vocab_size={self.vocab_size}, "
                f"bos_id={self.bos_id}, eos_id={self.eos_id})")

    @property
    def vocab_size(self) -> int:
        """Number of tokens (special ones included)."""
        return len(self.tokens)

    def encode(self, text: str) -> list[int]:
        """``text`` -> token ids (no BOS/EOS added)."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got "
                            f"{type(text).__name__}")
        return self.backend.encode(text, add_special_tokens=False).ids

    def decode(self, ids) -> str:
        """Token ids (a list or a 1-D tensor) -> text, special tokens
        written out."""
        if hasattr(ids, "tolist"):
            ids = ids.tolist()
        if not isinstance(ids, list) or not all(
                isinstance(i, int) and 0 <= i < self.vocab_size
                for i in ids):
            raise ValueError(f"ids must be a list of ints in [0, "
                             f"{self.vocab_size}), got {ids!r:.80}")
        return self.backend.decode(ids, skip_special_tokens=False)

    def apply_chat_template(self, messages: list[dict], *,
                            add_generation_prompt: bool = True) -> str:
        """Render ``messages`` (``[{"role": ..., "content": ...}]``) with
        the file's Jinja2 chat template (ChatML for SmolLM2), as
        ``transformers`` does: sandboxed, ``trim_blocks`` and
        ``lstrip_blocks`` on."""
        if self.chat_template is None:
            raise ValueError("the tokenizer has no chat_template")
        if not isinstance(messages, list) or not all(
                isinstance(m, dict) and isinstance(m.get("role"), str)
                and isinstance(m.get("content"), str) for m in messages):
            raise ValueError(f"messages must be a list of dicts with str "
                             f"'role' and 'content', got {messages!r:.80}")
        from jinja2.sandbox import ImmutableSandboxedEnvironment
        env = ImmutableSandboxedEnvironment(trim_blocks=True,
                                            lstrip_blocks=True)
        special = {f"{name}_token": self.tokens[i] for name, i in
                   (("bos", self.bos_id), ("eos", self.eos_id),
                    ("pad", self.pad_id), ("unk", self.unk_id))
                   if i is not None}
        return env.from_string(self.chat_template).render(
            messages=messages, add_generation_prompt=add_generation_prompt,
            **special)
