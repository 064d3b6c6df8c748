r"""Batched greedy generation for prompts of different lengths.

A batch is one rectangle of ids, so prompts of lengths $T_0^{(b)}$ are
padded to the longest, $T_0 = \max_b T_0^{(b)}$. Three things make the
padded batch compute exactly what each prompt would compute alone:

* **left padding**: row $b$ gets $T_0 - T_0^{(b)}$ pad slots *before* its
  prompt, so every row's last prompt token sits in the last column and
  every decode step appends one column for all rows at once;
* **per-row positions**: row $b$'s $j$-th real token has position $j$,
  not its column; the column is $j + T_0 - T_0^{(b)}$;
* **a padding-aware mask**: ``attention_mask`` (B, S) is False on the pad
  slots, and it grows by one True column per decode step, so no query
  ever attends to a pad slot, in the prompt or in the cache.

Serving systems avoid the padding altogether by packing sequences
(paged KV cache, continuous batching); this module is the rectangular
batch that a single ``model(...)`` call needs.

Shape letters: B batch (prompts), T0 longest prompt, S cached + new
slots, V vocabulary size.
"""
from __future__ import annotations

import torch

from .._util.threads import small_ops
from .._util.validation import (
    check_attrs,
    check_bool,
    check_int,
    check_prompts,
    check_type,
)
from ..model.kv_cache import KVCache

__all__ = ["left_pad", "generate_ragged"]


def left_pad(prompts: list[torch.Tensor], pad_token_id: int = 0
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack 1-D prompts into one left-padded batch.

    Args:
        prompts: a non-empty list of B integer tensors ``(T0_b,)``.
        pad_token_id: the id written into the pad slots, an int >= 0.

    Returns:
        ``(ids, attention_mask)``: ``(B, T0)`` int64 ids and ``(B, T0)``
        bool, True on the real tokens, each row's prompt ending in the
        last column.
    """
    check_prompts(prompts)
    check_int("pad_token_id", pad_token_id, minimum=0)
    T0 = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), T0), pad_token_id,
                     dtype=torch.long)                       # (B, T0)
    attention_mask = torch.zeros(len(prompts), T0, dtype=torch.bool)
    for b, p in enumerate(prompts):
        ids[b, T0 - len(p):] = p                             # right-aligned
        attention_mask[b, T0 - len(p):] = True
    return ids, attention_mask


@small_ops()  # one small forward per token: see course_lib._util.threads
@torch.no_grad()
def generate_ragged(model: torch.nn.Module, prompts: list[torch.Tensor],
                    max_new_tokens: int, *, pad_token_id: int = 0,
                    per_row_positions: bool = True) -> list[torch.Tensor]:
    r"""Greedy generation for a batch of prompts of different lengths,
    with a KV cache: one prefill call on the left-padded batch, then one
    decode call per token for all rows.

    Each step takes $x_{t+1}^{(b)} = \arg\max_v z_t^{(b)}[v]$ per row, as
    :func:`~course_lib.generation.sampling.generate` does with
    ``temperature=0``; the decode call passes the grown mask
    $m_{1:S+1} = [m_{1:S}, 1]$, and the model derives each row's
    positions from it.

    Args:
        model: a :class:`~course_lib.model.decoder_lm.DecoderLM` (accepts
            ``cache=`` and ``attention_mask=``, has a ``config``).
        prompts: a non-empty list of 1-D integer tensors ``(T0_b,)``,
            ``T0_b >= 1``.
        max_new_tokens: tokens to append to every prompt, an int
            $\ge 1$; the longest prompt plus them must fit in
            ``config.max_position_embeddings``.
        pad_token_id: id of the pad slots, in ``[0, vocab_size)``; the
            mask keeps it out of every result.
        per_row_positions: True (right) numbers each row from its first
            real token; False numbers the columns instead, shifting a
            padded row's positions by its padding: the classic bug,
            kept to show what it does.

    Returns:
        B int64 tensors ``(T0_b + max_new_tokens,)``: each prompt
        followed by its generated tokens, without padding.
    """
    check_prompts(prompts)
    check_int("max_new_tokens", max_new_tokens, minimum=1)
    check_bool("per_row_positions", per_row_positions)
    check_type("model", model, torch.nn.Module, "a torch.nn.Module")
    config = getattr(model, "config", None)
    check_attrs("model.config", config, ("vocab_size", "num_hidden_layers",
                                         "max_position_embeddings"),
                "a DecoderLMConfig")
    check_int("pad_token_id", pad_token_id, minimum=0,
              maximum=config.vocab_size - 1)
    T0 = max(len(p) for p in prompts)
    check_int("longest prompt + max_new_tokens", T0 + max_new_tokens,
              minimum=1, maximum=config.max_position_embeddings)

    ids, mask = left_pad(prompts, pad_token_id)              # (B, T0) each
    B = ids.shape[0]
    cache = KVCache(config.num_hidden_layers,
                    max_len=config.max_position_embeddings)

    def step(new: torch.Tensor) -> torch.Tensor:
        """Feed new (B, T) after the cache; return the next ids (B,)."""
        past = cache.seq_len
        # False: column numbers, the same for every row (the bug).
        positions = None if per_row_positions else torch.arange(
            past, past + new.shape[1])                       # (T,)
        logits = model(new, positions, cache=cache,
                       attention_mask=mask)                  # (B, T, V)
        return logits[:, -1].argmax(dim=-1)                  # (B,)

    was_training = model.training
    model.eval()
    try:
        out = [step(ids)]                                    # prefill
        for _ in range(max_new_tokens - 1):                  # decode
            mask = torch.cat([mask, torch.ones(B, 1, dtype=torch.bool)],
                             dim=1)                          # (B, S + 1)
            out.append(step(out[-1][:, None]))
    finally:
        model.train(was_training)
    new_ids = torch.stack(out, dim=1)                        # (B, n)
    return [torch.cat([p.long(), new_ids[b]])
            for b, p in enumerate(prompts)]
