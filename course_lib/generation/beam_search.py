r"""Beam search: look for the most likely continuation instead of sampling.

Greedy decoding keeps one prefix and extends it by its best token. Beam
search keeps the $W$ best prefixes (the *beams*, $W$ = ``beam_width``): at
every step it extends each beam by every token of the vocabulary, scores
each of the $W \cdot V$ candidates by its log-probability

$$\log P(y \mid x) = \sum_{s=1}^{|y|} \log p(y_s \mid x, y_{<s}),$$

and keeps the $W$ best. A candidate that ends in the end token
(``eos_id``) is finished and leaves the beam. With $W = 1$ this is greedy
decoding; with $W \ge V^{n-1}$ no prefix of an $n$-token continuation is
ever dropped and the search is exhaustive. In between it is a heuristic:
the best sequence can fall out of the beam early.

Finished sequences of different lengths are compared by a length-
normalised score. A sum of log-probabilities only falls as a sequence
grows, so raw scores favour short outputs. This module uses the length
penalty of Google's neural translation system (Wu et al., 2016):

$$\mathrm{score}(y) = \frac{\log P(y \mid x)}{\mathrm{lp}(y)}, \qquad
\mathrm{lp}(y) = \Big(\frac{5 + |y|}{5 + 1}\Big)^{\alpha},$$

with $|y|$ the number of generated tokens (the end token included) and
$\alpha$ = ``length_penalty``: $\alpha = 0$ ranks by log-probability
alone, larger $\alpha$ favours longer sequences. (Hugging Face divides by
$|y|^{\alpha}$ instead; both are monotone in $|y|$ for $\alpha > 0$.)
Candidates in the beam are ranked by $\log P$, as in Hugging Face; the
penalty only ranks the finished ones.

**Several prompts at once.** :func:`batch_beam_search` runs $B$ prompts
in one model call per step: their beams are the $B \cdot W$ rows of one
batch, row $b W + w$ holding beam $w$ of prompt $b$. Three things make
each prompt's search the one :func:`beam_search` runs alone:

* the prompts are left-padded to one length and an ``attention_mask``
  hides the pad slots, with positions counted per row
  (:mod:`course_lib.generation.ragged`, chapter 9);
* a prompt with fewer than $W$ live beams (at the first step it has
  one, the prompt itself) fills its other rows with *dead* beams of
  log-probability $-\infty$, whose candidates are never chosen (Hugging
  Face starts its beam scores at $0, -10^9, -10^9, \dots$ for the same
  reason);
* the candidates are ranked within each prompt: prompt $b$ chooses among
  the $W \cdot V$ extensions of its own rows only.

With the KV cache of chapter 9 a step feeds only the newest token of each
row. The beams chosen at a step extend rows of the previous step in a
new order (beam $w$ may continue old beam 2, beam 2 old beam 0), so the
cache is reordered to follow them, every layer's $K$ and $V$ gathered
along the batch axis by the source row ``beam_idx``, as Hugging Face's
``Cache.reorder_cache`` does:

$$K^{(l)}_{r,:,:,:} \leftarrow K^{(l)}_{\text{beam\_idx}[r],:,:,:}.$$

Shape letters: B prompts, W beam width, T sequence length, S cached +
new slots, V vocabulary size.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from .._util.threads import small_ops
from .._util.validation import (check_attrs, check_ids, check_int,
                                check_prompts, check_real, check_type)
from .sampling import context_window, model_logits

__all__ = ["Beam", "length_penalty_factor", "beam_search",
           "batch_beam_search"]


class Beam(NamedTuple):
    """One finished hypothesis of :func:`beam_search`."""
    ids: torch.Tensor   # (T0 + n,) the prompt followed by n new tokens
    log_prob: float     # log P(new tokens | prompt), in nats
    score: float        # log_prob / lp(n), the ranking score


def length_penalty_factor(n_tokens: int, alpha: float) -> float:
    r"""GNMT's length penalty $\mathrm{lp} = ((5 + n) / 6)^{\alpha}$.

    Args:
        n_tokens: $n \ge 1$, the number of generated tokens.
        alpha: $\alpha \ge 0$; 0 gives $\mathrm{lp} = 1$ (no
            normalisation).

    Returns:
        the divisor of the log-probability, a float $\ge 1$.
    """
    check_int("n_tokens", n_tokens, minimum=1)
    check_real("alpha", alpha, minimum=0)
    return ((5 + n_tokens) / 6) ** alpha


@torch.no_grad()
@small_ops()  # small forwards, one per step: see course_lib._util.threads
def beam_search(model: torch.nn.Module, prompt_ids: torch.Tensor, *,
                beam_width: int, max_new_tokens: int,
                length_penalty: float = 0.0, eos_id: int | None = None,
                max_len: int | None = None) -> list[Beam]:
    r"""Beam search with GNMT length normalisation (see the module text).

    Each step runs the model once on the $W$ live beams, adds
    $\log p(v \mid \text{beam})$ to each beam's log-probability for every
    token $v$, and walks the $W \cdot V$ candidates from best to worst
    (ties: lower beam, then lower token id first, so $W = 1$ is exactly
    greedy decoding with ``argmax``). A candidate ending in ``eos_id`` is
    finished; any other joins the next beams, until $W$ have been taken.
    Candidates of probability 0 are dropped. After ``max_new_tokens``
    steps the live beams are finished as they are. The finished hypotheses
    are returned best first by score.

    Args:
        model: maps ``(W, T)`` token ids to ``(W, T, V)`` logits.
        prompt_ids: ``(T0,)`` integer ids of one prompt, ``T0 >= 1``.
        beam_width: $W \ge 1$.
        max_new_tokens: the longest continuation, an int $\ge 1$.
        length_penalty: $\alpha \ge 0$ of
            $\mathrm{lp} = ((5 + n)/6)^\alpha$.
        eos_id: ``None`` or the id of the end token.
        max_len: context window; default the model's
            ``config.max_position_embeddings`` if it has one, else no
            cropping.

    Returns:
        at most $W$ :class:`Beam` s, ``(ids, log_prob, score)``, sorted by
        score, best first.
    """
    if not callable(model):
        raise TypeError(f"model must be callable (ids -> logits), got "
                        f"{type(model).__name__}")
    check_ids("prompt_ids", prompt_ids)
    if prompt_ids.dim() != 1:
        raise ValueError(f"prompt_ids must have shape (T0,) (one prompt), "
                         f"got {tuple(prompt_ids.shape)}")
    check_int("beam_width", beam_width, minimum=1)
    check_int("max_new_tokens", max_new_tokens, minimum=1)
    check_real("length_penalty", length_penalty, minimum=0)
    if eos_id is not None:
        check_int("eos_id", eos_id, minimum=0)
    window = context_window(model, max_len)
    beams = prompt_ids.long()[None, :]                        # (1, T0)
    beam_lp = torch.zeros(1, dtype=torch.float64)             # (1,)
    finished: list[Beam] = []

    def finish(ids: torch.Tensor, lp: float) -> None:
        n = ids.shape[0] - prompt_ids.shape[0]
        finished.append(Beam(ids, lp, lp / length_penalty_factor(
            n, length_penalty)))

    was_training = getattr(model, "training", None)
    if isinstance(model, torch.nn.Module):
        model.eval()
    try:
        for step in range(max_new_tokens):
            context = beams if window is None else beams[:, -window:]
            logits = model_logits(model, context)             # (W, T', V)
            V = logits.shape[-1]
            if eos_id is not None and eos_id >= V:
                raise ValueError(f"eos_id must be < V = {V}, got {eos_id}")
            # 1) log P(prefix + v) = log P(prefix) + log p(v | prefix)
            logp = F.log_softmax(logits[:, -1, :].double(), dim=-1)
            cand = (beam_lp[:, None] + logp).reshape(-1)      # (W * V,)
            # 2) best first; the stable sort breaks ties by flat index
            order = torch.sort(cand, descending=True, stable=True).indices
            keep_ids, keep_lp = [], []
            for flat in order.tolist():
                lp = cand[flat].item()
                if lp == float("-inf") or len(keep_ids) == beam_width:
                    break
                b, v = divmod(flat, V)
                ids = torch.cat([beams[b], beams.new_tensor([v])])
                # 3) an end token finishes a hypothesis; others stay live
                if v == eos_id:
                    finish(ids, lp)
                else:
                    keep_ids.append(ids)
                    keep_lp.append(lp)
            if not keep_ids:
                break
            beams = torch.stack(keep_ids)                     # (W, T + 1)
            beam_lp = torch.tensor(keep_lp, dtype=torch.float64)
        else:
            # 4) out of steps: the live beams end here
            for ids, lp in zip(beams, beam_lp.tolist()):
                finish(ids, lp)
    finally:
        if isinstance(model, torch.nn.Module):
            model.train(was_training)
    finished.sort(key=lambda beam: -beam.score)               # stable
    return finished[:beam_width]


def _reorder_cache(cache, beam_idx: torch.Tensor) -> None:
    """Row r of every cached tensor becomes row ``beam_idx[r]`` (the beam
    it continues): Hugging Face's ``Cache.reorder_cache``."""
    for layer in cache.layers:
        layer.tensors = tuple(t.index_select(0, beam_idx)
                              for t in layer.tensors)  # (B*W, G, S, d_k)


@torch.no_grad()
@small_ops()  # small forwards, one per step: see course_lib._util.threads
def batch_beam_search(model: torch.nn.Module, prompts: list[torch.Tensor],
                      *, beam_width: int, max_new_tokens: int,
                      length_penalty: float = 0.0, eos_id: int | None = None,
                      pad_token_id: int = 0) -> list[list[Beam]]:
    r""":func:`beam_search` for $B$ prompts of any lengths at once, with
    a KV cache (see the module text).

    The $B \cdot W$ beams are the rows of one left-padded batch. A prefill
    call reads the prompts; then each step scores row $r$'s candidates
    $\log P(\text{beam}_r) + \log p(v \mid \text{beam}_r)$, ranks the
    $W \cdot V$ candidates of each prompt exactly as :func:`beam_search`
    does (best first, ties by lower beam then lower token), keeps $W$ of
    them, reorders the cache rows to the beams they extend and feeds
    the $B \cdot W$ new tokens. Per prompt the result is that of
    :func:`beam_search` on the prompt alone, up to the rounding of a
    batched matrix product.

    Args:
        model: a :class:`~course_lib.model.decoder_lm.DecoderLM` (accepts
            ``cache=`` and ``attention_mask=``, has a ``config``).
        prompts: a non-empty list of B 1-D integer tensors ``(T0_b,)``.
        beam_width: $W \ge 1$.
        max_new_tokens: the longest continuation, an int $\ge 1$; the
            longest prompt plus it must fit in
            ``config.max_position_embeddings`` (a cache cannot slide).
        length_penalty: $\alpha \ge 0$ of
            $\mathrm{lp} = ((5 + n)/6)^\alpha$.
        eos_id: ``None`` or the id of the end token.
        pad_token_id: id written into the pad slots (masked out).

    Returns:
        B lists, one per prompt, of at most $W$ :class:`Beam` s sorted by
        score, best first; each ``ids`` is the prompt without padding
        followed by the new tokens.
    """
    check_prompts(prompts)
    check_int("beam_width", beam_width, minimum=1)
    check_int("max_new_tokens", max_new_tokens, minimum=1)
    check_real("length_penalty", length_penalty, minimum=0)
    check_type("model", model, torch.nn.Module, "a torch.nn.Module")
    config = getattr(model, "config", None)
    check_attrs("model.config", config, ("vocab_size", "num_hidden_layers",
                                         "max_position_embeddings"),
                "a DecoderLMConfig")
    V = config.vocab_size
    if eos_id is not None:
        check_int("eos_id", eos_id, minimum=0, maximum=V - 1)
    check_int("pad_token_id", pad_token_id, minimum=0, maximum=V - 1)
    T0 = max(len(p) for p in prompts)
    check_int("longest prompt + max_new_tokens", T0 + max_new_tokens,
              minimum=1, maximum=config.max_position_embeddings)
    from ..model.kv_cache import KVCache     # chapter 9's module
    from .ragged import left_pad             # chapter 9's module

    B, W = len(prompts), beam_width
    ids, mask = left_pad(prompts, pad_token_id)              # (B, T0) each
    ids = ids.repeat_interleave(W, dim=0)                    # (B*W, T0)
    mask = mask.repeat_interleave(W, dim=0)                  # (B*W, T0)
    # beam 0 of each prompt is live (log P = 0), the others dead (-inf)
    beam_lp = torch.full((B, W), float("-inf"), dtype=torch.float64)
    beam_lp[:, 0] = 0.0                                      # (B, W)
    new = torch.zeros(B * W, 0, dtype=torch.long)            # (B*W, n)
    finished: list[list[Beam]] = [[] for _ in range(B)]
    done = [False] * B
    cache = KVCache(config.num_hidden_layers,
                    max_len=config.max_position_embeddings)

    def finish(b: int, row_new: torch.Tensor, lp: float) -> None:
        n = row_new.shape[0]
        finished[b].append(Beam(torch.cat([prompts[b].long(), row_new]),
                                lp, lp / length_penalty_factor(
                                    n, length_penalty)))

    was_training = model.training
    model.eval()
    try:
        logits = model(ids, cache=cache, attention_mask=mask)  # prefill
        for step in range(max_new_tokens):
            # 1) log P(beam + v) for every row and token, per prompt
            logp = F.log_softmax(logits[:, -1].double(), dim=-1)
            cand = (beam_lp.reshape(-1, 1) + logp).reshape(B, W * V)
            # 2) best first within each prompt; stable: ties by flat index
            order = torch.sort(cand, dim=-1, descending=True,
                               stable=True).indices          # (B, W*V)
            beam_idx = torch.arange(B * W)                   # (B*W,)
            next_tok = torch.full((B * W,), pad_token_id, dtype=torch.long)
            next_lp = torch.full((B, W), float("-inf"), dtype=torch.float64)
            for b in range(B):
                if done[b]:
                    continue
                kept = 0
                for flat in order[b].tolist():
                    lp = cand[b, flat].item()
                    if lp == float("-inf") or kept == W:
                        break
                    w, v = divmod(flat, V)
                    src = b * W + w                          # its row
                    # 3) an end token finishes a hypothesis
                    if v == eos_id:
                        finish(b, torch.cat([new[src], new.new_tensor([v])]),
                               lp)
                        continue
                    beam_idx[b * W + kept] = src
                    next_tok[b * W + kept] = v
                    next_lp[b, kept] = lp
                    kept += 1
                # rows left over stay dead: they copy row b W, at -inf
                beam_idx[b * W + kept:(b + 1) * W] = b * W
                done[b] = kept == 0
            if all(done):
                break
            beam_lp = next_lp
            new = torch.cat([new[beam_idx], next_tok[:, None]],
                            dim=1)                           # (B*W, n + 1)
            if step + 1 == max_new_tokens:
                break
            # 4) the cache follows its beams; feed one token per row
            _reorder_cache(cache, beam_idx)
            mask = torch.cat([mask, torch.ones(B * W, 1, dtype=torch.bool)],
                             dim=1)                          # (B*W, S + 1)
            logits = model(next_tok[:, None], cache=cache,
                           attention_mask=mask)              # (B*W, 1, V)
        # 5) out of steps: the live beams of unfinished prompts end here
        for b in range(B):
            if done[b]:
                continue
            for w in range(W):
                lp = beam_lp[b, w].item()
                if lp > float("-inf"):
                    finish(b, new[b * W + w], lp)
    finally:
        model.train(was_training)
    for hyps in finished:
        hyps.sort(key=lambda beam: -beam.score)              # stable
    return [hyps[:W] for hyps in finished]
