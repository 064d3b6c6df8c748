r"""Speculative decoding: a cheap drafter guesses, the model checks.

A decoding step of a large model reads all its weights to produce one
token. Speculative decoding (Leviathan et al. 2023; Chen et al. 2023)
lets a cheap **drafter** propose $k$ tokens $x_1 \dots x_k$ and lets the
**target** model score all of them in *one* forward call: fed
$[x_0, x_1, \dots, x_k]$ after its KV cache ($x_0$ the last token it has
not seen), the target returns the $k+1$ next-token distributions

$$p_i = p(\cdot \mid \text{context}, x_1, \dots, x_{i-1}),
\qquad i = 1, \dots, k+1,$$

because causal attention computes every position's prediction in the
same pass. A **round** then keeps the longest acceptable prefix of the
draft plus one token of the target's own, so every target call yields
between 1 and $k+1$ tokens.

**Greedy** ($\tau = 0$): accept $x_i$ while it equals
$\arg\max p_i$; at the first mismatch append $\arg\max p_i$ (the
*correction*), and if all $k$ match append $\arg\max p_{k+1}$ (the
*bonus* token). Every appended token is the target's own argmax given
the tokens before it, so the output is the target's greedy output token
for token, whatever the drafter proposes: a bad drafter only costs
speed.

**Sampling** (modified rejection sampling): the drafter draws
$x_i \sim q_i$; the target accepts $x_1, x_2, \dots$ in turn, each with
probability $\min(1, p_i(x_i) / q_i(x_i))$
(:func:`~course_lib.generation.speculative.speculative_acceptance`,
chapter 8). At the first rejection, at position $i$, it draws a
replacement from the residual $r_i = \mathrm{norm}(\max(0, p_i - q_i))$
and the round ends; if all $k$ are accepted it draws the bonus token from
$p_{k+1}$. Temperature and the top-k / top-p / min-p filters are applied
to the logits of both models before the rule, so $p$ and $q$ are the
distributions that plain sampling would draw from.

*Why the output is distributed as* $p$. Take one position, with
$\beta = \sum_v \min(p_v, q_v)$ the probability that a draft is accepted.
The token $y$ comes out either as an accepted draft or as a replacement:

$$P(y) = q(y) \min\Big(1, \frac{p(y)}{q(y)}\Big) + (1 - \beta)\, r(y)
= \min(p(y), q(y)) + \max(0, p(y) - q(y)) = p(y),$$

since $1 - \beta = \sum_v \max(0, p_v - q_v)$ is exactly the residual's
normaliser. Along the draft the same holds for every position: given the
accepted prefix $x_{<i}$, $x_i$ was drawn from $q_i(\cdot \mid x_{<i})$
(whether position $i$ is reached depends only on $x_{<i}$ and earlier
coins) and is judged against $p_i = p(\cdot \mid x_{<i})$, so each emitted
token, given everything before it, is distributed as the target's
conditional; the bonus token is drawn from $p_{k+1}$ itself. Greedy is
the limit $\tau \to 0$: $p_i$ and $q_i$ become one-hot, the acceptance
probability is $[x_i = \arg\max p_i]$ and the residual is the one-hot on
$\arg\max p_i$. A *deterministic* drafter (prompt lookup) has a one-hot
$q = e_x$: it is accepted with probability $p(x)$ and the residual is
$p$ with $x$ removed and renormalised,
$P(y) = p(x)[y = x] + (1 - p(x))\,\frac{p(y)[y \ne x]}{1 - p(x)} = p(y)$.
The acceptance probability $\beta = 1 - D_{\mathrm{TV}}(p, q)$ is one
minus the total variation distance: a drafter is good when it *agrees*
with the target, not when it is accurate.

*Tokens per target call.* If each draft is accepted independently with
probability $a$ (Leviathan's $\alpha = E[\beta]$), the number $N$ of
accepted drafts has $P(N \ge i) = a^i$ for $i \le k$, and a round emits
$N + 1$ tokens:

$$E[N + 1] = \sum_{i=0}^{k} P(N \ge i) = \sum_{i=0}^{k} a^i
= \frac{1 - a^{k+1}}{1 - a}$$

(:func:`expected_tokens_per_call`; $k + 1$ at $a = 1$, 1 at $a = 0$).

*Speed-up* (Leviathan et al., Theorem 3.8). A round costs $k$ drafter
steps of $c$ target steps each and one target call. If the call on $k+1$
tokens costs as much as a one-token step (true when decoding is
memory-bound: the weights are read once either way), the round takes
$(kc + 1)$ target steps and

$$\text{speed-up} = \frac{1 - a^{k+1}}{(1 - a)(kc + 1)}.$$

On a CPU the call on $k+1$ tokens does $k+1$ times the arithmetic of one
step, and when the CPU is compute-bound it costs $v > 1$ steps;
:func:`expected_speedup` takes that cost (``verify_cost``):
$E[N+1] / (kc + v)$. A drafter made of the target's first $n$ of its
$N_L$ layers costs more than $n / N_L$ of a step, since it also runs the
output head ($V \times D$, a fifth of SmolLM2's weights).

The drafters:

* a smaller model with the same vocabulary (a
  :class:`~course_lib.model.decoder_lm.DecoderLM`), with its own KV cache;
* :func:`early_exit_draft`: the target's first $n$ layers, its final
  norm and head, sharing the weights (self-speculation, as in LayerSkip,
  Elhoushi et al. 2024, and ``transformers``' ``assistant_early_exit``);
* :class:`PromptLookup`: no model at all; the tokens that followed the
  most recent earlier occurrence of the context's last n-gram (Saxena's
  prompt lookup decoding, ``transformers``' ``prompt_lookup_num_tokens``):
  it shines when the output copies its input (editing code, a summary
  that quotes its source).

Caches: the target's cache holds every token but the last one emitted
(as in :func:`~course_lib.generation.sampling.generate`), so each round
feeds what the cache lacks followed by the draft; afterwards the
positions of rejected drafts are cropped
(:meth:`~course_lib.model.kv_cache.KVCache.crop`). A model drafter's
cache is cropped the same way; when all $k$ drafts were accepted it lacks
$x_k$ (never fed) and the bonus token, and the next round feeds both.

Shape letters: m drafted tokens in a round ($m \le k$), V vocabulary
size, L tokens so far.
"""
from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn

from .._util.threads import small_ops
from .._util.validation import (
    check_equal,
    check_ids,
    check_int,
    check_real,
    check_shape,
    check_type,
)
from ..generation.sampling import check_sampling_args, sampling_distribution
from ..generation.speculative import speculative_acceptance
from ..model.decoder_lm import DecoderLM
from ..model.kv_cache import KVCache

__all__ = ["SpeculativeStats", "PromptLookup", "early_exit_draft",
           "rejection_greedy_sample", "rejection_sample",
           "rejection_sample_outcomes", "speculative_generate",
           "speculative_generate_with_stats", "expected_tokens_per_call",
           "expected_speedup"]


@dataclasses.dataclass
class SpeculativeStats:
    """What a :func:`speculative_generate_with_stats` call did.

    Attributes:
        rounds: target forward calls (one per round, the prompt's
            prefill included in the first).
        drafted: tokens the drafter proposed, over all rounds.
        accepted: drafted tokens the target accepted.
        rejected: rounds that ended on a rejected draft (the others ended
            with all their drafts accepted, or proposed none).
        new_tokens: tokens generated.
    """
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    rejected: int = 0
    new_tokens: int = 0

    @property
    def acceptance_rate(self) -> float:
        """accepted / drafted, the draft acceptance rate vLLM reports
        (NaN if nothing was drafted). Drafts after a rejection count as
        drafted and never as accepted."""
        return self.accepted / self.drafted if self.drafted else float("nan")

    @property
    def alpha(self) -> float:
        r"""Estimate of the per-token acceptance probability $\alpha$ of
        the formulas: accepted / (accepted + rejected). Each judged draft
        is a Bernoulli($\alpha$) trial and judging stops at the first
        failure, so successes over trials is the maximum-likelihood
        estimate; drafts after a rejection were never judged."""
        judged = self.accepted + self.rejected
        return self.accepted / judged if judged else float("nan")

    @property
    def tokens_per_call(self) -> float:
        """new_tokens / rounds: tokens per target call (1 for plain
        decoding)."""
        return self.new_tokens / self.rounds if self.rounds else float("nan")


class PromptLookup:
    r"""A drafter without a model: copy what followed the last n-gram.

    For $n$ = ``max_ngram`` down to 1, take the context's last $n$ tokens
    and look for their most recent earlier occurrence; the (up to) $k$
    tokens that followed it are the draft. Saxena's reference code and
    ``transformers`` take the earliest occurrence; the most recent one is
    usually the passage being copied (the line being edited). The
    proposal is deterministic, so its $q$ is one-hot.

    Args:
        max_ngram: longest n-gram to match, an int $\ge 1$ (Saxena's
            ``max_ngram_size``).
    """

    def __init__(self, max_ngram: int = 3) -> None:
        check_int("max_ngram", max_ngram, minimum=1)
        self.max_ngram = max_ngram

    def __repr__(self) -> str:
        return f"PromptLookup(max_ngram={self.max_ngram})"

    def propose(self, ids: torch.Tensor, k: int) -> torch.Tensor:
        r"""Up to ``k`` draft tokens for the context ``ids`` ``(L,)``:
        ``(m,)`` int64 with $0 \le m \le k$ (empty if no n-gram
        recurs)."""
        check_ids("ids", ids)
        check_int("k", k, minimum=1)
        if ids.dim() != 1:
            raise ValueError(f"ids must be 1-D (L,), got "
                             f"{tuple(ids.shape)}")
        ids, L = ids.long(), ids.shape[0]
        for n in range(min(self.max_ngram, L - 1), 0, -1):
            suffix = ids[L - n:]                             # (n,)
            # windows ids[s:s+n] for s + n <= L - 1: each has a successor
            windows = ids[:L - 1].unfold(0, n, 1)            # (L - n, n)
            hits = (windows == suffix).all(dim=-1).nonzero()
            if len(hits):
                start = int(hits[-1]) + n                    # most recent
                return ids[start:start + k]                  # (m,)
        return ids[:0]


def early_exit_draft(model: DecoderLM, n_layers: int) -> DecoderLM:
    r"""A drafter made of ``model``'s first ``n_layers`` blocks, its final
    norm and its head: $\mathrm{head}(\mathrm{norm}(h^{n}))$ instead of
    $\mathrm{head}(\mathrm{norm}(h^{N}))$.

    The result is a :class:`~course_lib.model.decoder_lm.DecoderLM` that
    *shares* the modules (no weight is copied): its skeleton is built on
    the meta device, which allocates nothing, and its parts are then
    pointed at the model's. Without training for it (LayerSkip trains
    with an early-exit loss), the early layers' prediction agrees with
    the full model's only on easy tokens.

    Args:
        model: a :class:`~course_lib.model.decoder_lm.DecoderLM`.
        n_layers: blocks to keep, $1 \le n \le N$.

    Returns:
        A ``DecoderLM`` with ``config.num_hidden_layers = n_layers``, in
        ``model``'s training mode.
    """
    check_type("model", model, DecoderLM, "a DecoderLM")
    check_int("n_layers", n_layers, minimum=1,
              maximum=model.config.num_hidden_layers)
    config = dataclasses.replace(model.config, num_hidden_layers=n_layers)
    with torch.device("meta"):      # a skeleton: no memory, no weights
        draft = DecoderLM(config)
    draft.embed_tokens = model.embed_tokens
    draft.embed_positions = model.embed_positions
    draft.dropout = model.dropout
    draft.layers = nn.ModuleList(model.layers[:n_layers])   # shared blocks
    draft.norm = model.norm
    draft.lm_head = model.lm_head
    return draft.train(model.training)


def _check_round(p, q, draft, p_name: str = "p") -> None:
    """p (m+1, V) floating, q (m, V) or None, draft (m,) integer."""
    check_type(p_name, p, torch.Tensor, "a torch.Tensor")
    check_type("draft", draft, torch.Tensor, "a torch.Tensor")
    if draft.dim() != 1 or draft.dtype.is_floating_point \
            or draft.dtype == torch.bool:
        raise ValueError(f"draft must be a 1-D integer tensor (m,), got "
                         f"{draft.dtype} {tuple(draft.shape)}")
    m = draft.shape[0]
    if not p.dtype.is_floating_point or p.dim() != 2 or p.shape[0] != m + 1:
        raise ValueError(f"{p_name} must be a floating (m + 1, V) tensor "
                         f"with m = {m} drafts, got {p.dtype} "
                         f"{tuple(p.shape)}")
    if q is not None:
        check_shape("q", q, (m, p.shape[1]), f"(m, V) = ({m}, "
                    f"{p.shape[1]})")


def rejection_greedy_sample(logits: torch.Tensor, draft: torch.Tensor
                            ) -> tuple[int, int]:
    r"""One greedy round: accept the drafts that equal the target's
    argmax, then append the target's own token.

    $$n = \max\{j \le m : x_i = \arg\max z_i \ \forall i \le j\},
    \qquad y = \arg\max z_{n+1}.$$

    Args:
        logits: ``(m + 1, V)`` the target's logits $z_1 \dots z_{m+1}$ at
            the positions that predict $x_1 \dots x_m$ and the bonus.
        draft: ``(m,)`` integer ids $x_1 \dots x_m$, $m \ge 0$.

    Returns:
        ``(n, y)``: the number of accepted drafts and the appended token
        (the correction if $n < m$, the bonus if $n = m$).
    """
    _check_round(logits, None, draft, "logits")
    m = draft.shape[0]
    best = logits.argmax(dim=-1)                             # (m + 1,)
    agree = (draft.long() == best[:m]).long()                # (m,)
    n = int(agree.cumprod(dim=0).sum())                      # leading 1s
    return n, int(best[n])


def _round_rule(p, q, draft):
    """accept (m,) and next-token distributions (m + 1, V): the residuals
    r_1..r_m, then p_{m+1} (the bonus)."""
    m = draft.shape[0]
    accept, residual = speculative_acceptance(p[:m], q, draft.long())
    return accept, torch.cat([residual, p[m:]], dim=0)       # (m + 1, V)


def rejection_sample(p: torch.Tensor, q: torch.Tensor, draft: torch.Tensor,
                     *, generator: torch.Generator | None = None
                     ) -> tuple[int, int]:
    r"""One sampling round: modified rejection sampling (Leviathan et al.
    2023, Algorithm 1).

    Draw $u_i \sim U[0, 1)$; $x_i$ is accepted if $u_i < \min(1,
    p_i(x_i) / q_i(x_i))$; $n$ is the number of drafts before the first
    rejection ($m$ if none). The appended token is drawn from the residual
    $r_{n+1} = \mathrm{norm}(\max(0, p_{n+1} - q_{n+1}))$ if $n < m$, from
    $p_{m+1}$ if $n = m$.

    Args:
        p: ``(m + 1, V)`` the target's probabilities at the $m$ draft
            positions and the bonus position.
        q: ``(m, V)`` the drafter's probabilities (one-hot rows for a
            deterministic drafter), in ``p``'s dtype.
        draft: ``(m,)`` integer ids, each with $q_i(x_i) > 0$.
        generator: optional ``torch.Generator`` for reproducible draws.

    Returns:
        ``(n, y)``: accepted drafts and the appended token.
    """
    _check_round(p, q, draft)
    m = draft.shape[0]
    accept, nxt = _round_rule(p, q, draft)                   # (m,), (m+1, V)
    u = torch.rand(m, generator=generator, dtype=p.dtype)    # (m,)
    kept = (u < accept).long()                               # (m,)
    n = int(kept.cumprod(dim=0).sum())                       # first rejection
    y = torch.multinomial(nxt[n], 1, generator=generator)    # (1,)
    return n, int(y)


def rejection_sample_outcomes(p: torch.Tensor, q: torch.Tensor,
                              draft: torch.Tensor
                              ) -> tuple[torch.Tensor, torch.Tensor]:
    r"""The exact distribution of :func:`rejection_sample`'s outcome.

    With $a_i = \min(1, p_i(x_i) / q_i(x_i))$ and $a_{m+1} = 0$,

    $$P(n) = \Big(\prod_{i \le n} a_i\Big)(1 - a_{n+1}), \qquad
    P(y \mid n) = \begin{cases} r_{n+1}(y) & n < m \\
    p_{m+1}(y) & n = m. \end{cases}$$

    Args:
        p, q, draft: as in :func:`rejection_sample`.

    Returns:
        ``(prob_n, next_dist)``: ``(m + 1,)`` $P(n)$ for $n = 0 \dots m$
        (sums to 1) and ``(m + 1, V)`` the rows $P(y \mid n)$.
    """
    _check_round(p, q, draft)
    accept, nxt = _round_rule(p, q, draft)                   # (m,), (m+1, V)
    one = torch.ones(1, dtype=p.dtype)
    reach = torch.cat([one, accept.cumprod(dim=0)])          # (m+1,) P(N >= n)
    stop = torch.cat([1 - accept, one])                      # (m+1,)
    return reach * stop, nxt


def expected_tokens_per_call(alpha: float, k: int) -> float:
    r"""Expected tokens a round emits when each draft is accepted
    independently with probability $\alpha$:
    $(1 - \alpha^{k+1}) / (1 - \alpha)$, which is $k + 1$ at
    $\alpha = 1$.

    Args:
        alpha: $\alpha \in [0, 1]$.
        k: drafts per round, an int $\ge 1$.
    """
    check_real("alpha", alpha, minimum=0, maximum=1)
    check_int("k", k, minimum=1)
    if alpha == 1:
        return float(k + 1)
    return (1 - alpha ** (k + 1)) / (1 - alpha)


def expected_speedup(alpha: float, k: int, c: float, *,
                     verify_cost: float = 1.0) -> float:
    r"""Predicted speed-up of speculative decoding over plain decoding:

    $$\frac{1 - \alpha^{k+1}}{(1 - \alpha)(k c + v)},$$

    Leviathan et al.'s Theorem 3.8 for $v = 1$.

    Args:
        alpha: per-token acceptance probability in $[0, 1]$.
        k: drafts per round, an int $\ge 1$.
        c: cost of one drafter step in target steps, $\ge 0$ (0 for
            prompt lookup).
        verify_cost: $v$, cost of the target's call on $k + 1$ tokens in
            one-token steps, $> 0$ (1 when decoding is memory-bound).
    """
    tokens = expected_tokens_per_call(alpha, k)
    check_real("c", c, minimum=0)
    check_real("verify_cost", verify_cost, positive=True)
    return tokens / (k * c + verify_cost)


def _check_cache(name: str, cache, model: DecoderLM) -> KVCache:
    """An empty KVCache for ``model`` (a new one if None)."""
    config = model.config
    if cache is None:
        return KVCache(config.num_hidden_layers,
                       max_len=config.max_position_embeddings)
    check_type(name, cache, KVCache, "a KVCache or None")
    check_equal(f"{name}'s number of layers", len(cache),
                config.num_hidden_layers)
    if cache.seq_len:
        raise ValueError(f"{name} must be empty, got {cache.seq_len} "
                         f"cached positions")
    return cache


def _check_inputs(target, draft, prompt_ids, max_new_tokens, k, generator,
                  cache, draft_cache):
    """Validate speculative_generate's arguments; return the prompt as
    (T0,) int64 and the two caches (new ones if None; None for the
    drafter's if it has no model)."""
    check_type("target", target, DecoderLM, "a DecoderLM")
    check_type("draft", draft, (DecoderLM, PromptLookup),
               "a DecoderLM or a PromptLookup")
    check_ids("prompt_ids", prompt_ids)
    check_int("max_new_tokens", max_new_tokens, minimum=1)
    check_int("k", k, minimum=1)
    if generator is not None:
        check_type("generator", generator, torch.Generator,
                   "a torch.Generator or None")
    V = target.config.vocab_size
    if isinstance(draft, DecoderLM) and draft.config.vocab_size != V:
        raise ValueError(f"draft must have the target's vocabulary size "
                         f"{V}, got vocab_size={draft.config.vocab_size}")
    if prompt_ids.dim() == 2 and prompt_ids.shape[0] != 1:
        raise ValueError(f"prompt_ids must hold one sequence, (T0,) or "
                         f"(1, T0), got {tuple(prompt_ids.shape)}")
    seq = prompt_ids.reshape(-1).long()                      # (T0,)
    if seq.min() < 0 or seq.max() >= V:
        raise ValueError(f"prompt_ids must hold ids in [0, {V})")
    models = {"target": target}
    if isinstance(draft, DecoderLM):
        models["draft"] = draft
    total = len(seq) + max_new_tokens
    for name, model in models.items():
        limit = model.config.max_position_embeddings
        if total > limit:
            raise ValueError(
                f"prompt_ids ({len(seq)} tokens) + max_new_tokens="
                f"{max_new_tokens} = {total} tokens, more than the "
                f"{name}'s max_position_embeddings={limit}")
    cache = _check_cache("cache", cache, target)
    if isinstance(draft, PromptLookup):
        if draft_cache is not None:
            raise ValueError("draft_cache must be None for a PromptLookup "
                             "drafter (it has no model)")
    else:
        draft_cache = _check_cache("draft_cache", draft_cache, draft)
        if draft_cache is cache:
            raise ValueError("draft_cache must not be the target's cache")
    return seq, cache, draft_cache


def _draft_with_model(draft, cache, seq, m, temperature, filters,
                      generator):
    """m tokens (m,) from a draft model, fed what its cache lacks, and
    their distributions q (m, V) (None when greedy)."""
    tokens, probs = [], []
    new = seq[cache.seq_len:]                                # (>= 1,)
    for _ in range(m):
        z = draft(new[None], cache=cache)[0, -1]             # (V,)
        if temperature == 0:
            x = z.argmax(dim=-1, keepdim=True)               # (1,)
        else:
            q = sampling_distribution(z.double(), temperature=temperature,
                                      **filters)             # (V,)
            x = torch.multinomial(q, 1, generator=generator)  # (1,)
            probs.append(q)
        tokens.append(x)
        new = x
    q = torch.stack(probs) if probs else None                # (m, V)
    return torch.cat(tokens), q                              # (m,)


@torch.no_grad()
@small_ops()  # one small forward per draft token: see _util.threads
def speculative_generate_with_stats(
        target: DecoderLM, draft: DecoderLM | PromptLookup,
        prompt_ids: torch.Tensor, max_new_tokens: int, *, k: int = 4,
        temperature: float = 0.0, top_k: int | None = None,
        top_p: float | None = None, min_p: float | None = None,
        generator: torch.Generator | None = None,
        cache: KVCache | None = None,
        draft_cache: KVCache | None = None
        ) -> tuple[torch.Tensor, SpeculativeStats]:
    r""":func:`speculative_generate`, and what it did
    (:class:`SpeculativeStats`): rounds, drafted and accepted tokens.

    Returns:
        ``(ids, stats)``: the ids as :func:`speculative_generate` returns
        them, and the counts.
    """
    seq, cache, draft_cache = _check_inputs(
        target, draft, prompt_ids, max_new_tokens, k, generator, cache,
        draft_cache)
    check_sampling_args(temperature, top_k, top_p, min_p)
    V, total = target.config.vocab_size, len(seq) + max_new_tokens
    models = [target] if isinstance(draft, PromptLookup) else [target, draft]
    filters = dict(top_k=top_k, top_p=top_p, min_p=min_p)
    stats = SpeculativeStats()
    modes = [m.training for m in models]
    for model in models:            # eval mode (no dropout) for the call
        if model.training:
            model.eval()
    try:
        while len(seq) < total:
            # 1) draft m <= k tokens; a round emits at most m + 1
            m = min(k, total - len(seq) - 1)
            q = None
            if m == 0:
                proposal = seq[:0]                           # (0,)
            elif isinstance(draft, PromptLookup):
                proposal = draft.propose(seq, m)             # (m,)
            else:
                proposal, q = _draft_with_model(
                    draft, draft_cache, seq, m, temperature, filters,
                    generator)                               # (m,), (m, V)
            m = len(proposal)
            # 2) verify: ONE target call on what its cache lacks + draft
            fed = torch.cat([seq[cache.seq_len:], proposal])
            z = target(fed[None], cache=cache)[0, -(m + 1):]  # (m + 1, V)
            # 3) accept n drafts, then one token of the target's own
            if temperature == 0:
                n, y = rejection_greedy_sample(z, proposal)
            else:
                p = sampling_distribution(z.double(),
                                          temperature=temperature,
                                          **filters)         # (m + 1, V)
                if q is None:      # a deterministic drafter: one-hot q
                    q = F.one_hot(proposal, V).double()      # (m, V)
                n, y = rejection_sample(p, q, proposal,
                                        generator=generator)
            seq = torch.cat([seq, proposal[:n],
                             torch.tensor([y])])             # (L + n + 1,)
            # 4) caches keep every token but the last: drop rejected ones
            cache.crop(len(seq) - 1)
            if draft_cache is not None:
                draft_cache.crop(min(draft_cache.seq_len, len(seq) - 1))
            stats.rounds += 1
            stats.drafted += m
            stats.accepted += n
            stats.rejected += int(n < m)
            stats.new_tokens += n + 1
    finally:                        # the target's mode last: it wins
        for model, mode in reversed(list(zip(models, modes))):
            if mode:                # for modules an early exit shares
                model.train()
    return seq.reshape(*prompt_ids.shape[:-1], -1), stats


def speculative_generate(
        target: DecoderLM, draft: DecoderLM | PromptLookup,
        prompt_ids: torch.Tensor, max_new_tokens: int, *, k: int = 4,
        temperature: float = 0.0, top_k: int | None = None,
        top_p: float | None = None, min_p: float | None = None,
        generator: torch.Generator | None = None,
        cache: KVCache | None = None,
        draft_cache: KVCache | None = None) -> torch.Tensor:
    r"""Generate with speculative decoding: the drafter proposes up to
    ``k`` tokens a round, the target checks them in one forward call.

    Greedy ($\tau = 0$) gives the target's greedy output
    (:func:`~course_lib.generation.sampling.generate` with
    ``temperature=0, use_cache=True``) token for token, up to float
    rounding between a call on $k+1$ tokens and $k+1$ calls on one; with
    $\tau > 0$ every token is distributed as the target's sampling
    distribution (temperature and filters applied), whatever the drafter.
    See the module docstring for the rule and its proof.

    Args:
        target: the :class:`~course_lib.model.decoder_lm.DecoderLM` whose
            output is produced.
        draft: a ``DecoderLM`` with the target's vocabulary size (a small
            model, or :func:`early_exit_draft`), or a
            :class:`PromptLookup`.
        prompt_ids: ``(T0,)`` or ``(1, T0)`` integer ids, one sequence;
            ``T0 + max_new_tokens`` must fit in both models'
            ``config.max_position_embeddings``.
        max_new_tokens: tokens to generate, an int $\ge 1$.
        k: most tokens drafted per round, an int $\ge 1$ (fewer near
            the end, and a prompt lookup may find fewer or none).
        temperature, top_k, top_p, min_p: as in
            :func:`~course_lib.generation.sampling.sample_next`, applied
            to both models' logits; ``temperature=0`` is greedy.
        generator: optional ``torch.Generator`` for the draws.
        cache, draft_cache: empty
            :class:`~course_lib.model.kv_cache.KVCache` s for the target
            and a model drafter (default new ones); pass them to inspect
            them afterwards. The target's ends holding every token but
            the last, the drafter's a prefix of them.

    Returns:
        ``(T0 + max_new_tokens,)`` or ``(1, T0 + max_new_tokens)`` int64
        ids: the prompt followed by the generated tokens.
    """
    ids, _ = speculative_generate_with_stats(
        target, draft, prompt_ids, max_new_tokens, k=k,
        temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
        generator=generator, cache=cache, draft_cache=draft_cache)
    return ids
