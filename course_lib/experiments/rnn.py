r"""Recurrent networks and the three limits that motivated attention.

A recurrent network reads a sequence one step at a time,
$h_t = \tanh(W_{xh} x_t + b_{xh} + W_{hh} h_{t-1} + b_{hh})$, so (1) the
$T$ steps cannot run in parallel, (2) the influence of $x_t$ on $h_T$ passes
through $T-t$ Jacobians and decays (or explodes) like $\rho^{T-t}$, and (3)
the longest signal path between two positions grows like $O(T)$. This module
measures the second and third; the first is timed in
:mod:`course_lib.experiments.sequential_cost`, and the recall experiment,
where the second limit shows in accuracy, is
:mod:`course_lib.experiments.recall`.

Shape letters: B batch, T sequence length, D input width (d_in), d_h
hidden width (the package docstring's H means heads, not this).
"""
from __future__ import annotations

import math
from collections import deque

import torch
from torch import nn

from .._util.validation import check_bool, check_int, check_real, check_type

__all__ = ["SimpleRNN", "rnn_forward", "gru_forward", "set_recurrent_scale",
           "gradient_norm_vs_distance",
           "PATH_KINDS", "MAX_PATH_STEPS", "max_path_length", "draw_seq2seq"]

_ACTIVATIONS = {"tanh": torch.tanh, "relu": torch.relu, "linear": lambda z: z}


class SimpleRNN(nn.Module):
    r"""Elman RNN written as an explicit loop over time.

    $h_t = \phi(W_{xh} x_t + b_{xh} + W_{hh} h_{t-1} + b_{hh})$ with
    $h_0 = 0$ unless given. Parameter names and initialisation follow
    ``torch.nn.RNN`` so that weights can be copied across.

    Args:
        input_size: D, width of each input vector $x_t$.
        hidden_size: d_h, width of the hidden state $h_t$.
        nonlinearity: $\phi$; "tanh" (default), "relu" or "linear" (the
            identity, used for the closed-form gradient analysis).
    """

    def __init__(self, *, input_size: int, hidden_size: int,
                 nonlinearity: str = "tanh") -> None:
        super().__init__()
        if nonlinearity not in _ACTIVATIONS:
            raise ValueError(f"nonlinearity must be one of "
                             f"{sorted(_ACTIVATIONS)}, got {nonlinearity!r}")
        check_int("input_size", input_size, minimum=1)
        check_int("hidden_size", hidden_size, minimum=1)
        self.input_size, self.hidden_size = input_size, hidden_size
        self.nonlinearity = nonlinearity
        self.weight_ih = nn.Parameter(torch.empty(hidden_size, input_size))
        self.weight_hh = nn.Parameter(torch.empty(hidden_size, hidden_size))
        self.bias_ih = nn.Parameter(torch.empty(hidden_size))
        self.bias_hh = nn.Parameter(torch.empty(hidden_size))
        # Same scheme as torch.nn.RNN: U(-1/sqrt(d_h), 1/sqrt(d_h)) everywhere.
        bound = 1.0 / math.sqrt(hidden_size)
        for p in self.parameters():
            nn.init.uniform_(p, -bound, bound)

    def forward(self, x: torch.Tensor, h0: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """Run the recurrence over ``x`` (B, T, D) from ``h0`` (B, d_h).

        Returns ``(outputs, h_T)``: every state (B, T, d_h) and the last
        (B, d_h).
        """
        if x.dim() != 3 or x.shape[-1] != self.input_size:
            raise ValueError(f"x must have shape (B, T, {self.input_size}), "
                             f"got {tuple(x.shape)}")
        B, T, _ = x.shape
        if h0 is None:
            h0 = x.new_zeros(B, self.hidden_size)  # (B, d_h)
        elif h0.shape != (B, self.hidden_size):
            raise ValueError(f"h0 must have shape ({B}, {self.hidden_size}), "
                             f"got {tuple(h0.shape)}")
        phi = _ACTIVATIONS[self.nonlinearity]
        h, outputs = h0, []
        for t in range(T):  # the loop that cannot be parallelised over t
            # h_t = phi(W_xh x_t + b_xh + W_hh h_{t-1} + b_hh)
            h = phi(x[:, t] @ self.weight_ih.T + self.bias_ih
                    + h @ self.weight_hh.T + self.bias_hh)  # (B, d_h)
            outputs.append(h)
        return torch.stack(outputs, dim=1), h  # (B, T, d_h), (B, d_h)


def _check_recurrent_weights(x: torch.Tensor, weight_ih: torch.Tensor,
                             weight_hh: torch.Tensor, bias_ih: torch.Tensor,
                             bias_hh: torch.Tensor, gates: int) -> int:
    """Check ``torch.nn.RNN``/``GRU``-shaped weights against ``x``
    (B, T, D), with ``gates`` blocks of d_h rows; return d_h."""
    for name, t in (("x", x), ("weight_ih", weight_ih),
                    ("weight_hh", weight_hh), ("bias_ih", bias_ih),
                    ("bias_hh", bias_hh)):
        check_type(name, t, torch.Tensor, "a torch.Tensor")
    if x.dim() != 3:
        raise ValueError(f"x must have shape (B, T, D), got {tuple(x.shape)}")
    if weight_hh.dim() != 2 or weight_hh.shape[0] != gates * \
            weight_hh.shape[1] or weight_hh.shape[1] < 1:
        raise ValueError(f"weight_hh must have shape ({gates}*d_h, d_h), "
                         f"got {tuple(weight_hh.shape)}")
    d_h = weight_hh.shape[1]
    rows = gates * d_h
    if weight_ih.shape != (rows, x.shape[-1]):
        raise ValueError(f"weight_ih must have shape ({rows}, "
                         f"{x.shape[-1]}), got {tuple(weight_ih.shape)}")
    for name, t in (("bias_ih", bias_ih), ("bias_hh", bias_hh)):
        if t.shape != (rows,):
            raise ValueError(f"{name} must have shape ({rows},), got "
                             f"{tuple(t.shape)}")
    return d_h


def rnn_forward(x: torch.Tensor, weight_ih: torch.Tensor,
                weight_hh: torch.Tensor, bias_ih: torch.Tensor,
                bias_hh: torch.Tensor) -> torch.Tensor:
    r"""Every state of the tanh Elman RNN, from $h_0 = 0$.

    $h_t = \tanh(W_{xh} x_t + b_{xh} + W_{hh} h_{t-1} + b_{hh})$, the
    recurrence of :class:`SimpleRNN` (and of ``torch.nn.RNN``) with the
    given parameters instead of a module's.

    Args:
        x: inputs (B, T, D).
        weight_ih: $W_{xh}$ (d_h, D); weight_hh: $W_{hh}$ (d_h, d_h);
        bias_ih, bias_hh: (d_h,). The shapes of ``torch.nn.RNN``.
    Returns:
        all states $h_1, \dots, h_T$ stacked, (B, T, d_h).
    """
    _check_recurrent_weights(x, weight_ih, weight_hh, bias_ih, bias_hh, 1)
    h = x.new_zeros(x.shape[0], weight_hh.shape[0])          # (B, d_h)
    states = []
    for t in range(x.shape[1]):
        h = torch.tanh(x[:, t] @ weight_ih.T + bias_ih
                       + h @ weight_hh.T + bias_hh)           # (B, d_h)
        states.append(h)
    if not states:                                           # T = 0
        return x.new_zeros(x.shape[0], 0, weight_hh.shape[0])
    return torch.stack(states, dim=1)                        # (B, T, d_h)


def gru_forward(x: torch.Tensor, weight_ih: torch.Tensor,
                weight_hh: torch.Tensor, bias_ih: torch.Tensor,
                bias_hh: torch.Tensor) -> torch.Tensor:
    r"""Every state of a one-layer GRU (Cho et al., 2014), from $h_0 = 0$,
    in ``torch.nn.GRU``'s convention.

    With $\sigma$ the logistic function and $\odot$ the elementwise
    product, at each step

    $$r_t = \sigma(W_{ir}x_t + b_{ir} + W_{hr}h_{t-1} + b_{hr}),\qquad
      z_t = \sigma(W_{iz}x_t + b_{iz} + W_{hz}h_{t-1} + b_{hz}),$$
    $$n_t = \tanh\big(W_{in}x_t + b_{in}
            + r_t \odot (W_{hn}h_{t-1} + b_{hn})\big),\qquad
      h_t = (1 - z_t)\odot n_t + z_t \odot h_{t-1}.$$

    The reset gate $r_t$ multiplies $W_{hn}h_{t-1} + b_{hn}$, bias
    included (PyTorch's and cuDNN's form; the paper puts $r_t$ on
    $h_{t-1}$ before the product). The update gate $z_t$ near 1 keeps the
    old state: along that path the Jacobian is $\mathrm{diag}(z_t)$, the
    GRU's version of the LSTM's forget gate.

    Args:
        x: inputs (B, T, D).
        weight_ih: $[W_{ir}; W_{iz}; W_{in}]$ stacked by rows, (3 d_h, D);
        weight_hh: $[W_{hr}; W_{hz}; W_{hn}]$, (3 d_h, d_h);
        bias_ih: $[b_{ir}; b_{iz}; b_{in}]$, (3 d_h,); bias_hh: likewise.
            The order (reset, update, new) and the shapes are those of
            ``torch.nn.GRU``'s ``weight_ih_l0`` etc.
    Returns:
        all states $h_1, \dots, h_T$ stacked, (B, T, d_h).
    """
    d_h = _check_recurrent_weights(x, weight_ih, weight_hh, bias_ih,
                                   bias_hh, 3)
    h = x.new_zeros(x.shape[0], d_h)                         # (B, d_h)
    gx = x @ weight_ih.T + bias_ih                           # (B, T, 3 d_h)
    states = []
    for t in range(x.shape[1]):
        x_r, x_z, x_n = gx[:, t].split(d_h, dim=-1)          # 3 x (B, d_h)
        h_r, h_z, h_n = (h @ weight_hh.T + bias_hh).split(d_h, dim=-1)
        r = torch.sigmoid(x_r + h_r)                         # reset gate
        z = torch.sigmoid(x_z + h_z)                         # update gate
        n = torch.tanh(x_n + r * h_n)                        # candidate
        h = (1 - z) * n + z * h                              # (B, d_h)
        states.append(h)
    if not states:                                           # T = 0
        return x.new_zeros(x.shape[0], 0, d_h)
    return torch.stack(states, dim=1)                        # (B, T, d_h)


def set_recurrent_scale(rnn: nn.Module, *, rho: float,
                        generator: torch.Generator | None = None) -> None:
    r"""Set ``rnn.weight_hh`` to $\rho Q$ with $Q$ a random orthogonal matrix.

    Every eigenvalue of $\rho Q$ has modulus $\rho$ and every singular value
    equals $\rho$, so $\|W_{hh}^k\|_2 = \rho^k$ exactly: $\rho$ is both
    the spectral radius and the per-step gain of the linear recurrence.

    Args:
        rnn: a module with a square ``weight_hh`` (d_h, d_h) parameter.
        rho: the scale $\rho > 0$.
        generator: optional RNG for the orthogonal matrix.
    """
    check_real("rho", rho, positive=True)
    if not isinstance(getattr(rnn, "weight_hh", None), torch.Tensor):
        raise TypeError(f"rnn must be a recurrent layer with a weight_hh "
                        f"matrix (e.g. rnn.ElmanRNN), got "
                        f"{type(rnn).__name__}")
    d_h = rnn.weight_hh.shape[0]
    a = torch.randn(d_h, d_h, generator=generator)  # (d_h, d_h)
    q, r = torch.linalg.qr(a)
    q = q * torch.sign(torch.diagonal(r))  # sign fix: Haar-uniform Q
    with torch.no_grad():
        rnn.weight_hh.copy_(rho * q)


def gradient_norm_vs_distance(rnn: nn.Module, x: torch.Tensor) -> torch.Tensor:
    r"""Frobenius norm of $\partial h_T / \partial x_t$ against distance.

    By the chain rule, with $a_s$ the pre-activation at step $s$,
    $\frac{\partial h_T}{\partial x_t} = \Big(\prod_{s=t+1}^{T}
    \mathrm{diag}(\phi'(a_s)) W_{hh}\Big)\mathrm{diag}(\phi'(a_t)) W_{xh}$:
    a product of $T-t$ matrices, whose norm behaves like $\rho^{T-t}$.
    The Jacobian is computed exactly by autograd (one batched backward pass
    seeded with every unit vector of $h_T$).

    Args:
        rnn: a module returning ``(outputs, h_T)``; ``h_T`` may be (B, d_h) or
            ``torch.nn.RNN``'s (layers, B, d_h) (the last layer is used).
        x: inputs (B, T, D).

    Returns:
        (B, T) tensor whose entry ``[b, k]`` is
        $\|\partial h_T / \partial x_{T-k}\|_F$ for sample ``b``, so column
        ``k`` is distance ``k`` (k = 0 is the last input).
    """
    check_type("rnn", rnn, nn.Module, "a torch.nn.Module")
    check_type("x", x, torch.Tensor, "a torch.Tensor")
    if x.dim() != 3:
        raise ValueError(f"x must have shape (B, T, D), got {tuple(x.shape)}")
    x = x.detach().clone().requires_grad_(True)
    h_T = rnn(x)[1]
    h_T = h_T[-1] if h_T.dim() == 3 else h_T  # (B, d_h)
    B, d_h = h_T.shape
    # One backward pass vmapped over the d_h one-hot seeds e_j: seed j gives
    # row j of every sample's Jacobian at once (samples are independent, so
    # sample b's gradient only reaches x[b]).
    seeds = torch.eye(d_h).unsqueeze(1).expand(d_h, B, d_h)  # (d_h, B, d_h)
    (jac,) = torch.autograd.grad(h_T, x, grad_outputs=seeds,
                                 is_grads_batched=True)  # (d_h, B, T, D)
    jac = jac.permute(1, 2, 0, 3)  # (B, T, d_h, D)
    norms = jac.pow(2).sum(dim=(2, 3)).sqrt()  # (B, T), indexed by t
    return norms.flip(1)  # (B, T), indexed by distance k = T - 1 - t


PATH_KINDS = ("rnn", "cnn", "dilated_cnn", "restricted_attention", "attention")

# Most candidate successors :func:`max_path_length`'s search may look at
# (about 2 s in CPython); longer sequences are answered by the closed
# forms of its docstring.
MAX_PATH_STEPS = 2_000_000


def _search_steps(kind: str, n: int, k: int) -> int:
    """Upper bound on the candidate successors the search of
    :func:`max_path_length` looks at: ``k`` for every node of the layers
    below the answer's depth that input 0 reaches (rnn: 2 layers of ``n``
    nodes; attention: ``n`` successors of one node)."""
    if kind == "rnn":
        return 2 * n
    if kind == "attention":
        return n
    if kind == "dilated_cnn":  # layer l reaches positions 0 .. k^l - 1
        nodes, reach = 0, 1
        while reach < n:
            nodes, reach = nodes + reach, reach * k
        return max(nodes, 1) * k
    # cnn: ceil((n - 1) / (k - 1)) layers, layer l reaches l (k - 1) + 1
    depth = max(1, -(-(n - 1) // (k - 1)))
    return (depth + (k - 1) * depth * (depth - 1) // 2) * k


def _successors(kind: str, node: tuple[int, int], n: int, k: int):
    """Nodes that read ``node`` = (layer, position); layer 0 is the input."""
    layer, i = node
    if kind == "rnn":  # x_i -> h_i; h_i -> h_{i+1} (both live in layer 1)
        targets = [i] if layer == 0 else [i + 1]
        return [(1, j) for j in targets if j < n]
    if kind == "attention":  # one layer: every output reads every input
        return [(layer + 1, j) for j in range(n)]
    # Causal convolution / causal window: output j of layer l+1 reads inputs
    # j - m * dilation, m = 0..k-1; WaveNet-style dilation k**l doubles reach.
    dilation = k ** layer if kind == "dilated_cnn" else 1
    return [(layer + 1, i + m * dilation) for m in range(k)
            if i + m * dilation < n]


def max_path_length(kind: str, length: int, *, kernel_size: int = 3) -> int:
    r"""Longest shortest path (in edges) from an input to an output position.

    Builds the layered dependency graph of ``kind`` lazily and runs a BFS
    from input position 0; the answer is the BFS distance of the first node
    at output position ``length - 1`` (the farthest pair, since every graph
    here is causal and shift-invariant). Closed forms, Table 1 of Vaswani et
    al. (2017): rnn $n$; cnn (contiguous) and restricted_attention
    $\lceil (n-1)/(k-1) \rceil$; dilated_cnn $\lceil \log_k n \rceil$;
    attention 1 (for $n > 1$; a single position needs 0 or 1 edge).

    Args:
        kind: one of "rnn", "cnn", "dilated_cnn", "restricted_attention",
            "attention".
        length: n, the sequence length.
        kernel_size: k, the kernel width or attention window (>= 2).

    The search looks at no more than :data:`MAX_PATH_STEPS` candidate
    edges (a few seconds); a longer one (rnn beyond a million positions,
    cnn with $k = 2$ beyond about 1400) raises a ValueError.
    """
    if kind not in PATH_KINDS:
        raise ValueError(f"kind must be one of {PATH_KINDS}, got {kind!r}")
    check_int("length", length, minimum=1)
    check_int("kernel_size", kernel_size, minimum=2)
    steps = _search_steps(kind, length, kernel_size)
    if steps > MAX_PATH_STEPS:
        raise ValueError(
            f"length={length} with kernel_size={kernel_size} needs a "
            f"search over about {steps:,} {kind} graph edges, more than "
            f"MAX_PATH_STEPS={MAX_PATH_STEPS:,}; the closed forms in the "
            f"docstring give the answer for long sequences")
    graph = "cnn" if kind == "restricted_attention" else kind
    start = (0, 0)
    dist = {start: 0}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for nxt in _successors(graph, node, length, kernel_size):
            if nxt in dist:
                continue
            dist[nxt] = dist[node] + 1
            if nxt[1] == length - 1:  # reached the last output position
                return dist[nxt]
            queue.append(nxt)
    raise RuntimeError("unreachable")  # every graph here is connected


def draw_seq2seq(ax, source: list[str], target: list[str], *,
                 attention: bool = False) -> None:
    """Draw an RNN encoder-decoder translating ``source`` into ``target``.

    Encoder states $h_1..h_n$ read the source left to right; the last one is
    the fixed-size context $c$, the only thing the decoder sees of the
    source; decoder states $s_1..s_m$ each read the previous output.
    Arrows are dependencies, so the longest chain has $n + m$ steps.
    With ``attention=True`` (Bahdanau et al.) the last state only starts
    the decoder, and every decoder step also reads every $h_i$ (orange).

    Args:
        ax: a matplotlib Axes to draw into.
        source, target: token strings (ASCII; plain matplotlib fonts).
        attention: draw the attention version instead of the bottleneck.
    """
    if not hasattr(ax, "text") or not hasattr(ax, "plot"):
        raise TypeError(f"ax must be a matplotlib Axes, got "
                        f"{type(ax).__name__}")
    check_bool("attention", attention)
    for name, words in (("source", source), ("target", target)):
        if not isinstance(words, (list, tuple)) or \
                not all(isinstance(w, str) for w in words):
            raise TypeError(f"{name} must be a list of token strings, got "
                            f"{type(words).__name__}")
    if not source or not target:
        raise ValueError(f"source and target must be non-empty, got "
                         f"{len(source)} and {len(target)} tokens")
    n, m = len(source), len(target)
    enc_x = [1.4 * i for i in range(n)]
    c_x = enc_x[-1] + 1.6
    dec_x = [c_x + 1.6 + 1.4 * j for j in range(m)]
    arrow = dict(arrowstyle="->", color="0.3", lw=1.2)

    def box(x, y, text, color):
        ax.text(x, y, text, ha="center", va="center", fontsize=10,
                bbox=dict(boxstyle="round,pad=0.35", fc=color, ec="0.3"))

    def link(x0, y0, x1, y1, **kw):
        ax.annotate("", xy=(x1, y1), xytext=(x0, y0),
                    arrowprops={**arrow, **kw})

    for i, (x, tok) in enumerate(zip(enc_x, source)):
        box(x, 0, f"$h_{i + 1}$", "#cfe2f3")
        box(x, -1.3, tok, "white")
        link(x, -1.05, x, -0.3)
        if i:
            link(enc_x[i - 1] + 0.35, 0, x - 0.35, 0)
    if attention:  # no single c: the last state only starts the decoder
        link(enc_x[-1] + 0.35, 0, c_x + 1.25, 0)
        ax.text(c_x, -0.75, "every step reads\nevery $h_i$", ha="center",
                fontsize=9, color="#e69138")
    else:
        box(c_x, 0, "$c$", "#f4cccc")
        link(enc_x[-1] + 0.35, 0, c_x - 0.3, 0, color="#cc0000", lw=2)
        ax.text(c_x, 0.75, "fixed-size\nbottleneck", ha="center",
                fontsize=9, color="#cc0000")
    inputs = ["<bos>"] + target[:-1]
    for j, (x, tok) in enumerate(zip(dec_x, target)):
        box(x, 0, f"$s_{j + 1}$", "#d9ead3")
        box(x, -1.3, inputs[j], "white")
        box(x, 1.3, tok, "#fff2cc")
        link(x, -1.05, x, -0.3)
        link(x, 0.3, x, 1.05)
        if attention:
            for xi in enc_x:  # one weighted average of all h_i per step
                link(xi, 0.3, x - 0.15, 0.3, color="#e69138", lw=0.7,
                     alpha=0.7, connectionstyle="arc3,rad=-0.25")
        if j or not attention:
            prev = c_x + 0.3 if j == 0 else dec_x[j - 1] + 0.35
            link(prev, 0, x - 0.35, 0, **({"color": "#cc0000", "lw": 2}
                                            if j == 0 else {}))
        if j:  # each output is fed back as the next input
            link(dec_x[j - 1] + 0.2, 1.1, x - 0.2, -1.1, ls=":", color="0.6")
    ax.text(sum(enc_x) / n, -2.1, "encoder", ha="center", fontsize=11)
    ax.text(sum(dec_x) / m, -2.1, "decoder", ha="center", fontsize=11)
    ax.set_xlim(-0.8, dec_x[-1] + 0.8)
    ax.set_ylim(-2.4, 2.6 if attention else 1.9)
    ax.axis("off")
