r"""Reading a GGUF file: metadata, the tensor list, and dequantisation.

GGUF (llama.cpp's format) is one file holding everything a model needs:
a header, key-value *metadata* (architecture sizes under keys such as
``llama.embedding_length``, the tokenizer's vocabulary and merges, the
chat template) and the tensors, many of them *quantised*: stored in
blocks of 32 weights that share a scale.

In the Q4_1 format a block of 32 weights takes 20 bytes: an fp16 scale
$d$, an fp16 minimum $m$ and 32 four-bit integers $q_j \in \{0, \dots,
15\}$, two per byte. Weight $j$ is

$$w_j = d\,q_j + m,$$

so a block spans $[m, m + 15d]$ in 16 equal steps: 5 bits per weight
(4 for $q$, 32 bits of $d$ and $m$ shared by 32 weights) instead of 32.
Q8_0 (used for the embedding table) stores $w_j = d\,q_j$ with a signed
8-bit $q_j$ and 34 bytes per block.

GGUF lists a tensor's dimensions fastest-first (``ne0`` = columns);
torch lists them slowest-first. :class:`TensorInfo` gives the torch order,
so a linear layer's weight is (out, in) as in ``nn.Linear``.

Shape letters: R rows (output features), C columns (input features).
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import numpy as np
import torch

__all__ = ["QK", "Q4_1_BLOCK_BYTES", "TensorInfo", "dequantize_q4_1_block",
           "GGUFFile"]

QK = 32                          # weights per quantisation block
Q4_1_BLOCK_BYTES = 2 + 2 + QK // 2  # fp16 d, fp16 m, 16 bytes of nibbles


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of a GGUF file: its name, GGML type (``"Q4_1"``,
    ``"Q8_0"``, ``"F32"`` ...), shape in torch order and bytes on disk.
    """
    name: str
    ggml_type: str
    shape: tuple[int, ...]
    n_bytes: int

    @property
    def numel(self) -> int:
        """Number of weights."""
        n = 1
        for s in self.shape:
            n *= s
        return n


def dequantize_q4_1_block(raw_bytes) -> torch.Tensor:
    r"""Decode ONE Q4_1 block by hand: 20 bytes -> 32 float32 weights.

    Layout (ggml's ``block_q4_1``): bytes 0-1 the fp16 scale $d$, bytes
    2-3 the fp16 minimum $m$, bytes 4-19 the quants. Byte $j$ holds
    $q_j$ in its low nibble and $q_{j+16}$ in its high nibble, so the low
    nibbles are elements 0-15 and the high nibbles elements 16-31. Then
    $w_j = d\,q_j + m$.

    Args:
        raw_bytes: 20 bytes (``bytes``, a uint8 numpy array or tensor).
    Returns:
        float32 tensor (32,).
    """
    if isinstance(raw_bytes, (bytes, bytearray, memoryview)):
        raw = np.frombuffer(raw_bytes, dtype=np.uint8)
    elif isinstance(raw_bytes, (np.ndarray, torch.Tensor)) \
            and str(raw_bytes.dtype).endswith("uint8"):
        raw = np.asarray(raw_bytes).reshape(-1)
    else:
        raise ValueError(f"raw_bytes must be {Q4_1_BLOCK_BYTES} bytes, got "
                         f"{type(raw_bytes).__name__}")
    if raw.size != Q4_1_BLOCK_BYTES:
        raise ValueError(f"raw_bytes must be {Q4_1_BLOCK_BYTES} bytes (one "
                         f"Q4_1 block), got {raw.size}")
    d = float(raw[0:2].view(np.float16)[0])            # scale
    m = float(raw[2:4].view(np.float16)[0])            # minimum
    qs = torch.from_numpy(raw[4:].astype(np.int64))    # (16,) two quants each
    low, high = qs & 0x0F, qs >> 4                     # (16,), (16,)
    q = torch.cat([low, high])                         # (32,) q_0 .. q_31
    # w_j = d q_j + m
    return (d * q.to(torch.float32) + m).to(torch.float32)


def _dequantize_q4_1(data: np.ndarray) -> np.ndarray:
    r"""Every Q4_1 block of a tensor at once: $w_j = d\,q_j + m$ (as
    :func:`dequantize_q4_1_block`); float32 (n_blocks, 32)."""
    blocks = data.reshape(-1, Q4_1_BLOCK_BYTES)              # (n, 20) bytes
    d = blocks[:, 0:2].view(np.float16).astype(np.float32)   # (n, 1)
    m = blocks[:, 2:4].view(np.float16).astype(np.float32)   # (n, 1)
    qs = blocks[:, 4:]                                       # (n, 16)
    w = np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.float32)
    w *= d                                                   # d q_j
    w += m                                                   # ... + m
    return w


def _dequantize_q8_0(data: np.ndarray) -> np.ndarray:
    r"""Every Q8_0 block at once: $w_j = d\,q_j$ with signed 8-bit
    $q_j$; float32 (n_blocks, 32)."""
    blocks = data.reshape(-1, 2 + QK)                        # (n, 34) bytes
    d = blocks[:, 0:2].view(np.float16).astype(np.float32)   # (n, 1)
    w = blocks[:, 2:].view(np.int8).astype(np.float32)       # (n, 32)
    w *= d
    return w


_DEQUANTIZE = {"Q4_1": _dequantize_q4_1, "Q8_0": _dequantize_q8_0}


@functools.lru_cache(maxsize=1)
def _plain_reader_class(reader_class: type) -> type:
    """``reader_class`` (gguf's ``GGUFReader``), reading from a plain
    ndarray view of its memory map instead of the ``np.memmap`` itself.

    The reader slices the map once per string of the metadata, about a
    million times for a tokenizer's vocabulary and merges, and each slice
    of an ``np.memmap`` costs several times that of a plain array (numpy's
    ``memmap.__array_finalize__``). The view has the same bytes, still
    mapped from the file and read-only: the same fields and tensors,
    parsed about three times faster (tested against ``GGUFReader``).
    """
    class PlainReader(reader_class):
        @property
        def data(self) -> np.ndarray:
            return self._plain

        @data.setter
        def data(self, value: np.ndarray) -> None:
            self._plain = value.view(np.ndarray)   # keeps the map alive

    return PlainReader


class GGUFFile:
    """A GGUF file opened with the ``gguf`` package's ``GGUFReader``
    (memory-mapped: tensors are read from disk only when asked for).

    Args:
        path: the ``.gguf`` file.

    Attributes:
        metadata: dict key -> value; strings decoded, arrays as lists.
        tensors: list of :class:`TensorInfo` in file order.
    """

    def __init__(self, path: str | os.PathLike) -> None:
        from gguf import GGUFReader  # runtime dependency
        if not isinstance(path, (str, os.PathLike)) \
                or not os.path.isfile(path):
            raise ValueError(f"path must be an existing .gguf file, got "
                             f"{path!r}")
        self.path = os.fspath(path)
        self.reader = _plain_reader_class(GGUFReader)(self.path)
        # GGUF.* entries are the header (version, counts), not metadata.
        self.metadata = {k: f.contents() for k, f in self.reader.fields.items()
                         if not k.startswith("GGUF.")}
        self._by_name = {t.name: t for t in self.reader.tensors}
        self.tensors = [TensorInfo(
            name=t.name, ggml_type=t.tensor_type.name,
            # GGUF: fastest dimension first; torch: slowest first
            shape=tuple(int(s) for s in reversed(t.shape.tolist())),
            n_bytes=int(t.n_bytes)) for t in self.reader.tensors]

    def __repr__(self) -> str:
        return (f"GGUFFile({os.path.basename(self.path)!r}, "
                f"{len(self.metadata)} keys, {len(self.tensors)} tensors)")

    def _tensor(self, name: str):
        if name not in self._by_name:
            raise ValueError(f"name must be a tensor of this file, got "
                             f"{name!r} (e.g. {self.tensors[0].name!r})")
        return self._by_name[name]

    def raw(self, name: str) -> np.ndarray:
        """The bytes (or floats, for F32) of tensor ``name`` as stored:
        a read-only view of the memory-mapped file."""
        return self._tensor(name).data

    def dequantize(self, name: str) -> torch.Tensor:
        """Tensor ``name`` decoded to float32, in torch order: (R, C) for a
        matrix, (C,) for a vector. Q4_1 and Q8_0 (all this course's file
        holds besides F32) are decoded block-wise for the whole tensor at
        once, with the operations of ``gguf.quants.dequantize`` in the
        same order, so the same bits (tested); it is about three times
        faster, as it does not loop over groups of 16 rows. Other types
        go through ``gguf.quants.dequantize``."""
        from gguf.quants import dequantize
        t = self._tensor(name)
        fast = _DEQUANTIZE.get(t.tensor_type.name)
        w = fast(t.data) if fast else dequantize(t.data, t.tensor_type)
        if not w.flags.writeable:      # F32 tensors: a view of the file
            w = w.copy()
        shape = tuple(int(s) for s in reversed(t.shape.tolist()))
        return torch.from_numpy(np.ascontiguousarray(w)).reshape(shape)

    def weight_bytes(self) -> dict[str, int]:
        """Bytes of all tensors at fp32 (4 per weight), bf16 (2) and as
        stored in the file (Q4_1: 20 bytes per 32 weights = 0.625)."""
        n = sum(t.numel for t in self.tensors)
        return {"fp32": 4 * n, "bf16": 2 * n,
                "stored": sum(t.n_bytes for t in self.tensors)}
