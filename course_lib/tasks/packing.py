r"""Packing: several documents in one row, with positions and a document mask.

Training batches are rows of a fixed length $T$. Documents are shorter and
of every length, so padding each one to $T$ would waste most of the
compute; instead, consecutive documents are *packed* into a row until it
is full. Two things then keep the documents apart, so that every
document is processed exactly as if it were alone:

* the **position ids** restart at 0 at each document's first token (a
  model with learned positions or RoPE would otherwise see the second
  document at positions $n_1, n_1 + 1, \dots$);
* the **document mask**, :func:`document_causal_mask`: causal AND same
  document, a block-diagonal
  matrix of lower triangles, so no token reads an earlier document.

With both, the logits of a document in the packed row equal those of the
document run alone (to rounding). A plain causal mask lets each document
read the ones packed before it. Kernels with variable-length support
(FlashAttention's ``cu_seqlens``, FlexAttention's block masks) take the
document boundaries instead of a dense (T, T) mask, and skip the blocks
the mask empties (:mod:`course_lib.experiments.mask_cost`).

Shape letters: B batch (rows), T row length, V vocabulary, D model width.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from .._util.validation import check_alloc, check_ids, check_int, check_type
from ..model.decoder_lm import DecoderLM
from ..model.masks import causal_mask

__all__ = ["PackedBatch", "pack_documents", "document_causal_mask",
           "packed_forward"]


class PackedBatch(NamedTuple):
    """Rows of packed documents (all (B, T) int64), and where each went.

    ``spans[k]`` = ``(row, start, end)``: document ``k`` occupies
    ``input_ids[row, start:end]``. Padding at the end of a row has
    document id -1, token ``pad_id`` and positions from 0 (a document of
    its own, which no real token reads).
    """
    input_ids: torch.Tensor
    position_ids: torch.Tensor
    document_ids: torch.Tensor
    spans: list[tuple[int, int, int]]


def pack_documents(documents, row_length: int, *,
                   pad_id: int = 0) -> PackedBatch:
    r"""Pack documents, in order, into rows of ``row_length`` tokens.

    Each document goes into the current row if it fits, else it starts a
    new row (no document is split; greedy, in order). Within a document
    the position ids are $0, 1, \dots, n - 1$, and the document id is its
    index in ``documents``.

    Args:
        documents: a non-empty list of 1-D integer tensors, each of
            1 to ``row_length`` tokens.
        row_length: $T$, tokens per row.
        pad_id: the token that fills the end of a row.
    Returns:
        A :class:`PackedBatch`.
    """
    check_int("row_length", row_length, minimum=1)
    check_int("pad_id", pad_id, minimum=0)
    if not isinstance(documents, (list, tuple)) or not documents:
        raise TypeError(f"documents must be a non-empty list of 1-D "
                        f"integer tensors, got {type(documents).__name__}")
    for k, doc in enumerate(documents):
        check_type(f"documents[{k}]", doc, torch.Tensor, "a torch.Tensor")
        if doc.dtype.is_floating_point or doc.dtype == torch.bool \
                or doc.dim() != 1 or not 1 <= len(doc) <= row_length:
            raise ValueError(f"documents[{k}] must be a 1-D integer tensor "
                             f"of 1 to row_length={row_length} tokens, got "
                             f"{doc.dtype} of shape {tuple(doc.shape)}")
    spans, row, used = [], 0, 0
    for doc in documents:                 # first fit, in order
        if used + len(doc) > row_length:
            row, used = row + 1, 0
        spans.append((row, used, used + len(doc)))
        used += len(doc)
    B = row + 1
    input_ids = torch.full((B, row_length), pad_id)          # (B, T)
    document_ids = torch.full((B, row_length), -1)           # (B, T)
    position_ids = torch.zeros((B, row_length), dtype=torch.long)
    for k, (doc, (r, start, end)) in enumerate(zip(documents, spans)):
        input_ids[r, start:end] = doc
        document_ids[r, start:end] = k
        position_ids[r, start:end] = torch.arange(end - start)  # from 0
    for r in range(B):                    # padding: positions from 0 too
        pad = document_ids[r] == -1
        position_ids[r, pad] = torch.arange(int(pad.sum()))
    return PackedBatch(input_ids, position_ids, document_ids, spans)


def document_causal_mask(document_ids: torch.Tensor) -> torch.Tensor:
    r"""Causal mask of rows that pack several documents: (B, T, T) bool.

    Token $i$ may see token $j$ iff $j \le i$ and both belong to the same
    document, $d_j = d_i$: the causal mask AND a block-diagonal one, so
    no document reads another's tokens. With the positions restarting at
    0 in each document, every document's outputs are then those of the
    document run alone (:func:`packed_forward`).

    Args:
        document_ids: (B, T) integer ids, one per token (padding may be a
            document of its own, e.g. id -1).
    Returns:
        bool tensor (B, T, T), True where query $i$ may read key $j$.
    """
    check_ids("document_ids", document_ids)
    if document_ids.dim() != 2:
        raise ValueError(f"document_ids must have shape (B, T), got "
                         f"{tuple(document_ids.shape)}")
    B, T = document_ids.shape
    check_alloc("B * T * T", B * T * T)
    same = document_ids[:, :, None] == document_ids[:, None, :]  # (B, T, T)
    return same & causal_mask(T, device=document_ids.device)     # (B, T, T)


def packed_forward(model: DecoderLM, input_ids: torch.Tensor,
                   position_ids: torch.Tensor, mask: torch.Tensor
                   ) -> torch.Tensor:
    r"""Logits (B, T, V) of a :class:`~course_lib.model.decoder_lm.DecoderLM`
    on packed rows, with per-token positions and a (B, T, T) mask.

    The body of ``DecoderLM.forward`` with ``mask`` in place of its own
    causal mask (``forward`` takes per-row positions but builds the mask
    itself): embed, add learned positions if the model has them, run
    every block with ``mask`` and ``positions=position_ids`` (RoPE reads
    them), final norm, LM head.

    Args:
        model: a DecoderLM (no KV cache is used).
        input_ids, position_ids: (B, T) int64, e.g. from
            :func:`pack_documents`.
        mask: (B, T, T) bool, True = may attend, e.g.
            :func:`document_causal_mask`.
    """
    check_type("model", model, DecoderLM, "a DecoderLM")
    for name, t in (("input_ids", input_ids), ("position_ids", position_ids),
                    ("mask", mask)):
        check_type(name, t, torch.Tensor, "a torch.Tensor")
    B, T = input_ids.shape
    if position_ids.shape != (B, T) or mask.shape != (B, T, T) \
            or mask.dtype != torch.bool:
        raise ValueError(f"position_ids must be (B, T) = {(B, T)} and mask "
                         f"a bool (B, T, T), got {tuple(position_ids.shape)}"
                         f" and {mask.dtype} {tuple(mask.shape)}")
    h = model.embed_tokens(input_ids)                        # (B, T, D)
    if model.embed_positions is not None:
        h = h + model.embed_positions(position_ids)          # (B, T, D)
    h = model.dropout(h)
    for block in model.layers:
        h = block(h, mask, positions=position_ids)           # (B, T, D)
    return model.lm_head(model.norm(h))                      # (B, T, V)
