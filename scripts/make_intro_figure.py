"""Draw the one-page architecture overview used by book/intro.md.

Writes ``book/images/architecture.png``: tokens -> embedding + positions ->
a stack of N blocks (attention and FFN, each with a residual path) ->
final norm -> lm_head -> logits -> sampling -> next token, with the chapter
that covers each stage. Run by ``make notebooks``.
"""
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyBboxPatch  # noqa: E402

OUT = Path(__file__).resolve().parents[1] / "book" / "images" / \
    "architecture.png"

# (label, chapter note, face colour), bottom to top.
STAGES = [
    ("token ids  [B, T]", "input", "#eeeeee"),
    ("token embedding + positions", "ch. 2", "#dbe9f6"),
    ("masked multi-head attention", "ch. 3-5, 9-10", "#fde2c8"),
    ("feed-forward network (or MoE)", "ch. 6, 11", "#d9f0d3"),
    ("final norm", "ch. 6", "#eeeeee"),
    ("lm_head  ->  logits  [B, T, V]", "ch. 6", "#e8dcf2"),
    ("softmax + sampling  ->  next token", "ch. 8", "#f6d5dc"),
]


def box(ax, y, text, note, colour, x=0.22, w=0.48, h=0.07):
    ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.008",
                                fc=colour, ec="#444444", lw=1.0))
    ax.text(x + w / 2, y + h / 2, text, ha="center", va="center",
            fontsize=10)
    ax.text(0.83, y + h / 2, note, ha="left", va="center",
            fontsize=9, color="#555555", style="italic")


def main() -> None:
    fig, ax = plt.subplots(figsize=(7.2, 7.6))
    ax.set_xlim(0, 1)
    ax.set_ylim(-0.02, 1.04)
    ax.axis("off")
    ys = [0.0, 0.13, 0.35, 0.53, 0.71, 0.82, 0.93]
    h, mid = 0.07, 0.46
    for y, (text, note, colour) in zip(ys, STAGES):
        box(ax, y, text, note, colour, h=h)
    arrow = dict(arrowstyle="-|>", color="#444444", lw=1.2)
    for y0, y1 in zip(ys[:-1], ys[1:]):
        ax.annotate("", xy=(mid, y1 - 0.008), xytext=(mid, y0 + h + 0.008),
                    arrowprops=arrow)
    # The repeated block: each sublayer's input skips around it and is
    # added to its output (the residual path).
    ax.add_patch(FancyBboxPatch((0.08, 0.255), 0.70, 0.405,
                                boxstyle="round,pad=0.01", fc="none",
                                ec="#1f77b4", lw=1.5, ls="--"))
    ax.text(0.765, 0.27, "repeated N times", color="#1f77b4", ha="right",
            fontsize=9.5, weight="bold")
    blue = "#1f77b4"
    for y_box in (ys[2], ys[3]):
        y_in, y_out = y_box - 0.045, y_box + h + 0.045
        ax.plot([mid, 0.15, 0.15], [y_in, y_in, y_out], color=blue, lw=1.1)
        ax.annotate("", xy=(mid - 0.018, y_out), xytext=(0.15, y_out),
                    arrowprops=dict(arrowstyle="-|>", color=blue, lw=1.1))
        ax.text(mid, y_out, "+", ha="center", va="center", fontsize=11,
                color=blue, weight="bold",
                bbox=dict(boxstyle="circle,pad=0.1", fc="white", ec=blue))
        ax.text(0.135, (y_in + y_out) / 2, "residual", rotation=90,
                ha="right", va="center", fontsize=8, color=blue)
    ax.set_title("A decoder-only Transformer, one forward pass",
                 fontsize=12)
    fig.savefig(OUT, dpi=110, bbox_inches="tight")
    plt.close(fig)
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
