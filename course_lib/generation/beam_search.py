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

Shape letters: W beam width, T sequence length, V vocabulary size.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from .._util.threads import small_ops
from .._util.validation import check_ids, check_int, check_real
from .sampling import context_window, model_logits

__all__ = ["Beam", "length_penalty_factor", "beam_search"]


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
