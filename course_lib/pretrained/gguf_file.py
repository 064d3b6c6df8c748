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
import struct
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


def _check_finite(w: torch.Tensor, name: str, path: str) -> None:
    """Every weight of tensor ``name`` must be finite: one NaN or infinite
    weight (a damaged fp16 scale, an F32 value) makes every logit that
    depends on it NaN.

    Tested on the smallest and largest weight (``torch.aminmax``
    propagates NaN): one pass without a temporary, about 20 times faster
    than ``torch.isfinite(w).all()`` on the 28-million-weight embedding.
    """
    if w.numel() and not bool(torch.isfinite(torch.stack(
            torch.aminmax(w))).all()):
        bad = int((~torch.isfinite(w)).sum())
        raise ValueError(f"tensor {name!r} of GGUF file {path!r} has NaN "
                         f"or infinite weights ({bad:,} of {w.numel():,}): "
                         f"the file is damaged")


class _Unreadable(ValueError):
    """Raised while parsing: the file's bytes contradict its own header."""


_ITEMSIZE: dict = {}      # numpy scalar type -> bytes per item


@functools.lru_cache(maxsize=1)
def _plain_reader_class(reader_class: type) -> type:
    """``reader_class`` (gguf's ``GGUFReader``), reading from a plain
    ndarray view of its memory map instead of the ``np.memmap`` itself,
    and checking what it reads against the file's size.

    The reader slices the map once per string of the metadata, about a
    million times for a tokenizer's vocabulary and merges, and each slice
    of an ``np.memmap`` costs several times that of a plain array (numpy's
    ``memmap.__array_finalize__``). The view has the same bytes, still
    mapped from the file and read-only: the same fields and tensors,
    parsed about three times faster (tested against ``GGUFReader``).

    ``GGUFReader`` itself slices past the end of a short file without
    noticing (a slice is merely shorter) and fails later with an error
    that names neither the file nor the cause, or never. Here every read
    must lie inside the file (``_get``), and every tensor's bytes inside
    the file and clear of the next tensor's (:func:`_check_tensor_ranges`)
    before any view of them is made.
    """
    class PlainReader(reader_class):
        def __init__(self, path, mode="r"):
            self._path = os.fspath(path)
            super().__init__(path, mode)

        @property
        def data(self) -> np.ndarray:
            return self._plain

        @data.setter
        def data(self, value: np.ndarray) -> None:
            self._plain = value.view(np.ndarray)   # keeps the map alive

        def _get(self, offset, dtype, count=1, override_order=None):
            # GGUFReader._get (``count`` items of ``dtype`` at ``offset``,
            # in the file's byte order), refusing to read past the end;
            # item sizes are cached, as this runs for every string.
            count = int(count)
            size = _ITEMSIZE.get(dtype)
            if size is None:
                size = _ITEMSIZE[dtype] = np.dtype(dtype).itemsize
            end = offset + size * count
            if end > self._plain.size:
                raise _Unreadable(
                    f"GGUF file {self._path!r} is truncated or damaged: "
                    f"its header needs {size * count:,} bytes at byte "
                    f"{int(offset):,}, past the end of the file "
                    f"({self._plain.size:,} bytes)")
            arr = self._plain[offset:end].view(dtype=dtype)
            return arr.view(arr.dtype.newbyteorder(
                self.byte_order if override_order is None
                else override_order))

        def _build_tensors(self, start_offs, fields) -> None:
            _check_tensor_ranges(self._path, self._plain.size, start_offs,
                                 self.alignment, fields)
            super()._build_tensors(start_offs, fields)

    return PlainReader


def _check_tensor_ranges(path: str, file_size: int, data_start: int,
                         alignment: int, fields) -> None:
    """Every tensor's bytes ``[offset, offset + nbytes)`` (``nbytes`` from
    its type and shape) must lie inside the file, start at a multiple of
    ``alignment`` and end before the next tensor starts; else a
    ``ValueError`` naming the file and the tensor.

    A damaged offset, shape or type would otherwise make the reader hand
    out a view of another tensor's bytes (or of bytes past the end of the
    file), which decodes to plausible-looking but wrong weights.
    ``fields`` are the reader's tensor-info fields (name, number of
    dimensions, dimensions, type, offset relative to ``data_start``).
    """
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType
    alignment, data_start = int(alignment), int(data_start)
    spans = []
    for field in fields:
        name, dims, raw_type, rel = (field.name, field.parts[3],
                                     int(field.parts[4][0]),
                                     int(field.parts[5][0]))
        where = f"tensor {name!r} of GGUF file {path!r}"
        try:
            qtype = GGMLQuantizationType(raw_type)
        except ValueError:
            raise _Unreadable(f"{where} has an unknown type {raw_type}") \
                from None
        block, type_size = GGML_QUANT_SIZES[qtype]
        dims = [int(d) for d in dims]        # GGUF order: fastest first
        if any(d < 1 for d in dims) or (dims and dims[0] % block):
            raise _Unreadable(
                f"{where} has dimensions {dims}: each must be >= 1 and the "
                f"first a multiple of {block} ({qtype.name} blocks)")
        numel = 1
        for d in dims:
            numel *= d
        start = data_start + rel
        end = start + numel // block * type_size
        if rel % alignment:
            raise _Unreadable(f"{where} starts at byte {start:,}, not at a "
                              f"multiple of the alignment {alignment}")
        if end > file_size:
            raise _Unreadable(
                f"{where} is truncated: its {qtype.name} data {dims} needs "
                f"bytes [{start:,}, {end:,}), but the file ends at byte "
                f"{file_size:,} (the file was cut short, or the tensor's "
                f"offset, shape or type is damaged)")
        spans.append((start, end, name))
    spans.sort()
    for (_, end, name), (start, _, after) in zip(spans, spans[1:]):
        if end > start:
            raise _Unreadable(
                f"tensor {name!r} of GGUF file {path!r} overlaps tensor "
                f"{after!r}: it ends at byte {end:,}, after {after!r} "
                f"starts at byte {start:,} (its offset, shape or type is "
                f"damaged)")


def _check_header(path: str) -> None:
    """The fixed header (magic, version, tensor and metadata counts) must
    be there, and the counts must fit in the file: each metadata entry
    takes at least 13 bytes (key length, type, a one-byte value) and each
    tensor entry at least 32 (name length, number of dimensions, one
    dimension, type, offset). A damaged count would otherwise send the
    reader through the file's bytes for a long time before it fails."""
    size = os.path.getsize(path)
    if size == 0:
        raise ValueError(f"GGUF file {path!r} is empty")
    with open(path, "rb") as f:
        head = f.read(24)
    if head[:4] != b"GGUF":
        raise ValueError(f"GGUF file {path!r} does not start with the "
                         f"magic bytes 'GGUF' (got {head[:4]!r}): not a "
                         f"GGUF file")
    if size < 24:
        raise ValueError(f"GGUF file {path!r} is truncated: {size} bytes, "
                         f"shorter than the 24-byte header")
    # the reader's test for a file of the other byte order
    order = ">" if struct.unpack("<I", head[4:8])[0] & 0xFFFF == 0 else "<"
    n_tensors, n_keys = struct.unpack(order + "QQ", head[8:24])
    for key, count, least in (("GGUF.tensor_count", n_tensors, 32),
                              ("GGUF.kv_count", n_keys, 13)):
        if count * least > size - 24:
            raise ValueError(
                f"GGUF file {path!r}: its header's {key} = {count:,} "
                f"entries cannot fit in its {size:,} bytes (a damaged "
                f"count, or a truncated file)")


class GGUFFile:
    """A GGUF file opened with the ``gguf`` package's ``GGUFReader``
    (memory-mapped: tensors are read from disk only when asked for).

    Args:
        path: the ``.gguf`` file.

    Attributes:
        metadata: dict key -> value; strings decoded, arrays as lists.
        tensors: list of :class:`TensorInfo` in file order.

    Raises:
        ValueError naming the file if it is empty, does not start with
        the GGUF header, declares more metadata or tensor bytes than it
        holds ("truncated"), or has a tensor whose bytes run into the
        next tensor's (the message names the tensor).
    """

    def __init__(self, path: str | os.PathLike) -> None:
        from gguf import GGUFReader  # runtime dependency
        if not isinstance(path, (str, os.PathLike)) \
                or not os.path.isfile(path):
            raise ValueError(f"path must be an existing .gguf file, got "
                             f"{path!r}")
        self.path = os.fspath(path)
        _check_header(self.path)
        try:
            self.reader = _plain_reader_class(GGUFReader)(self.path)
            # GGUF.* entries are the header (version, counts), not metadata.
            self.metadata = {k: f.contents()
                             for k, f in self.reader.fields.items()
                             if not k.startswith("GGUF.")}
        except _Unreadable as err:
            raise ValueError(str(err)) from None
        except (ValueError, KeyError, IndexError, OverflowError,
                RecursionError) as err:    # what gguf's parser raises
            raise ValueError(f"GGUF file {self.path!r} cannot be parsed "
                             f"(damaged): {type(err).__name__}: {err}"
                             ) from err
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
        go through ``gguf.quants.dequantize``.

        Raises:
            ValueError naming the tensor and the file if a weight is NaN
            or infinite (a damaged scale or value: the model's logits
            would be NaN).
        """
        from gguf.quants import dequantize
        t = self._tensor(name)
        fast = _DEQUANTIZE.get(t.tensor_type.name)
        with np.errstate(invalid="ignore", over="ignore"):  # checked below
            w = fast(t.data) if fast else dequantize(t.data, t.tensor_type)
        if not w.flags.writeable:      # F32 tensors: a view of the file
            w = w.copy()
        shape = tuple(int(s) for s in reversed(t.shape.tolist()))
        w = torch.from_numpy(np.ascontiguousarray(w)).reshape(shape)
        _check_finite(w, name, self.path)
        return w

    def weight_bytes(self) -> dict[str, int]:
        """Bytes of all tensors at fp32 (4 per weight), bf16 (2) and as
        stored in the file (Q4_1: 20 bytes per 32 weights = 0.625)."""
        n = sum(t.numel for t in self.tensors)
        return {"fp32": 4 * n, "bf16": 2 * n,
                "stored": sum(t.n_bytes for t in self.tensors)}
