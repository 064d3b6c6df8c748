"""Tests for course_lib.pretrained.gguf_file (chapter 13).

References: the gguf library (its GGUFReader and gguf.quants.dequantize)
for the hand-written Q4_1 block decoder, on real blocks of the SmolLM2
file and on blocks built from chosen numbers (the closed form d*q + m),
and for the whole-tensor Q4_1 and Q8_0 decoders on random blocks (also
in a file written with GGUFWriter); the published SmolLM2 sizes for the
metadata and the tensor list.
"""
import numpy as np
import pytest
import torch

from smollm2_support import needs_weights
from course_lib.pretrained.gguf_file import (Q4_1_BLOCK_BYTES, QK, GGUFFile,
                                             dequantize_q4_1_block)

gguf = pytest.importorskip("gguf")


def make_block(d: float, m: float, q: np.ndarray) -> bytes:
    """A Q4_1 block from scale, minimum and 32 quants in [0, 15]."""
    head = np.array([d, m], dtype=np.float16).tobytes()
    packed = (q[:16] | (q[16:] << 4)).astype(np.uint8).tobytes()
    return head + packed


def test_synthetic_block_is_d_q_plus_m():
    rng = np.random.default_rng(0)
    q = rng.integers(0, 16, size=32)
    d, m = 0.0123, -0.5
    raw = make_block(d, m, q)
    assert len(raw) == Q4_1_BLOCK_BYTES == 20
    got = dequantize_q4_1_block(raw)
    d16, m16 = float(np.float16(d)), float(np.float16(m))
    want = torch.tensor(d16 * q + m16, dtype=torch.float32)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    # the gguf library reads the same bytes the same way
    lib = gguf.quants.dequantize(np.frombuffer(raw, np.uint8)[None],
                                 gguf.GGMLQuantizationType.Q4_1)
    assert torch.equal(got, torch.from_numpy(lib.reshape(-1)))


def test_low_nibbles_are_the_first_half():
    q = np.zeros(32, dtype=np.int64)
    q[3], q[16 + 3] = 1, 15                 # byte 3: low 1, high 15
    w = dequantize_q4_1_block(make_block(1.0, 0.0, q))
    assert w[3] == 1 and w[19] == 15 and w.sum() == 16


def test_block_bad_input():
    for bad in (b"\x00" * 19, b"\x00" * 21, np.zeros(40, np.uint8)):
        with pytest.raises(ValueError, match="raw_bytes must be 20 bytes"):
            dequantize_q4_1_block(bad)
    with pytest.raises(ValueError, match="raw_bytes"):
        dequantize_q4_1_block("not bytes")


def test_bad_path():
    with pytest.raises(ValueError, match="path must be an existing"):
        GGUFFile("/nonexistent/model.gguf")


# ------------------------------------------------------ the real file
@pytest.fixture(scope="module")
def smol():
    from course_lib.pretrained.smollm2 import open_smollm2
    return open_smollm2()


@needs_weights
def test_metadata_is_plain_python(smol):
    md = smol.metadata
    assert md["general.architecture"] == "llama"
    assert md["llama.block_count"] == 30
    assert md["llama.embedding_length"] == 576
    assert md["llama.attention.head_count"] == 9
    assert md["llama.attention.head_count_kv"] == 3
    assert md["llama.feed_forward_length"] == 1536
    assert md["llama.rope.freq_base"] == 100000.0
    assert md["llama.context_length"] == 8192
    assert isinstance(md["tokenizer.chat_template"], str)
    tokens = md["tokenizer.ggml.tokens"]
    assert isinstance(tokens, list) and len(tokens) == 49152
    assert tokens[1] == "<|im_start|>" and isinstance(tokens[500], str)
    assert not any(k.startswith("GGUF.") for k in md)


@needs_weights
def test_tensor_list(smol):
    by = {t.name: t for t in smol.tensors}
    assert len(by) == 2 + 30 * 9            # embedding, final norm, 9/layer
    assert by["token_embd.weight"].shape == (49152, 576)
    assert by["token_embd.weight"].ggml_type == "Q8_0"
    assert by["blk.0.attn_k.weight"].shape == (192, 576)   # (out, in)
    assert by["blk.0.ffn_down.weight"].shape == (576, 1536)
    assert by["blk.0.attn_q.weight"].ggml_type == "Q4_1"
    assert by["output_norm.weight"].ggml_type == "F32"
    # bytes on disk: Q4_1 is 20 bytes per 32 weights
    t = by["blk.0.attn_q.weight"]
    assert t.n_bytes == t.numel // QK * Q4_1_BLOCK_BYTES


@needs_weights
@pytest.mark.parametrize("name", ["blk.0.attn_q.weight",
                                  "blk.17.ffn_down.weight",
                                  "blk.29.attn_v.weight"])
def test_hand_decoder_equals_gguf_library_on_real_blocks(smol, name):
    raw = smol.raw(name)                                  # (R, bytes/row)
    ref = smol.dequantize(name)                           # (R, C)
    R, C = ref.shape
    rng = np.random.default_rng(1)
    for r, b in zip(rng.integers(0, R, 20), rng.integers(0, C // QK, 20)):
        block = raw[r, b * Q4_1_BLOCK_BYTES:(b + 1) * Q4_1_BLOCK_BYTES]
        got = dequantize_q4_1_block(block)
        assert torch.equal(got, ref[r, b * QK:(b + 1) * QK])


@needs_weights
def test_dequantize_matches_gguf_reader(smol):
    t = next(t for t in smol.reader.tensors if t.name == "blk.3.attn_k.weight")
    lib = gguf.quants.dequantize(t.data, t.tensor_type)
    w = smol.dequantize("blk.3.attn_k.weight")
    assert w.dtype == torch.float32 and w.shape == (192, 576)
    assert torch.equal(w, torch.from_numpy(lib))
    norm = smol.dequantize("blk.3.attn_norm.weight")       # F32, a copy
    assert norm.shape == (576,)
    norm += 0                               # writable, file untouched
    with pytest.raises(ValueError, match="name must be a tensor"):
        smol.dequantize("blk.99.attn_q.weight")


@needs_weights
def test_weight_bytes(smol):
    b = smol.weight_bytes()
    n = 134_515_008
    assert b["fp32"] == 4 * n and b["bf16"] == 2 * n
    n_q41 = sum(t.numel for t in smol.tensors if t.ggml_type == "Q4_1")
    n_q80 = sum(t.numel for t in smol.tensors if t.ggml_type == "Q8_0")
    n_f32 = n - n_q41 - n_q80
    assert b["stored"] == n_q41 * 20 // 32 + n_q80 * 34 // 32 + 4 * n_f32
    assert b["stored"] < b["bf16"] / 2.5


@pytest.fixture(scope="module")
def gguf_reader(smol):
    """The same file parsed by the ``gguf`` package's own reader (once:
    a parse takes seconds), the reference for the two tests below."""
    return gguf.GGUFReader(smol.path)


@needs_weights
def test_reader_parses_what_gguf_reader_parses(smol, gguf_reader):
    # GGUFFile reads through a plain-array view of the memory map (faster
    # slicing); the fields and tensors must be those of gguf's own reader.
    ref = gguf_reader
    assert list(smol.reader.fields) == list(ref.fields)
    for key, field in ref.fields.items():
        assert smol.reader.fields[key].contents() == field.contents(), key
    assert len(smol.reader.tensors) == len(ref.tensors)
    for got, want in zip(smol.reader.tensors, ref.tensors):
        assert (got.name, got.tensor_type, got.n_bytes) == \
            (want.name, want.tensor_type, want.n_bytes)
        assert got.shape.tolist() == want.shape.tolist()
        assert np.array_equal(got.data, want.data), got.name
        assert not got.data.flags.writeable      # still the read-only file


@needs_weights
def test_dequantize_every_tensor_bitwise_as_gguf_quants(smol, gguf_reader):
    # The whole-tensor Q4_1 / Q8_0 decoders must give the bits of
    # gguf.quants.dequantize, on every tensor of the file, read by gguf's
    # own reader.
    ref = gguf_reader
    seen = set()
    for t in ref.tensors:
        want = torch.from_numpy(np.array(
            gguf.quants.dequantize(t.data, t.tensor_type), np.float32))
        got = smol.dequantize(t.name)
        assert got.dtype == torch.float32
        assert got.shape == tuple(reversed(t.shape.tolist()))
        assert torch.equal(got.view(torch.int32),
                           want.reshape(got.shape).view(torch.int32)), t.name
        seen.add(t.tensor_type.name)
    assert seen == {"Q4_1", "Q8_0", "F32"}


# ------------------------------------- whole-tensor decoders, synthetic
def random_blocks(n: int, block_bytes: int, seed: int) -> np.ndarray:
    """n random blocks whose leading fp16 fields (the scale d, and for
    Q4_1 the minimum m) are random finite fp16 numbers of every kind
    (normal, subnormal, signed zero); the rest random bytes."""
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, size=(n, block_bytes), dtype=np.uint8)
    n_fp16 = 2 if block_bytes == Q4_1_BLOCK_BYTES else 1
    halves = rng.integers(0, 1 << 16, size=(n, n_fp16), dtype=np.uint16)
    halves[(halves & 0x7C00) == 0x7C00] &= 0x3FFF     # no inf, no NaN
    halves[:4] = [[0x0001] * n_fp16, [0x8000] * n_fp16,   # subnormal, -0
                  [0x7BFF] * n_fp16, [0x03FF] * n_fp16]   # max, subnormal
    blocks[:, :2 * n_fp16] = halves.view(np.uint8)
    return blocks


@pytest.mark.parametrize("qtype, decode, block_bytes", [
    ("Q4_1", "_dequantize_q4_1", Q4_1_BLOCK_BYTES),
    ("Q8_0", "_dequantize_q8_0", 2 + QK)])
def test_whole_tensor_decoders_equal_gguf_quants(qtype, decode, block_bytes):
    # No SmolLM2 file needed: 4096 random blocks, bit for bit, both as the
    # private whole-tensor decoder and as GGUFFile.dequantize on a file
    from course_lib.pretrained import gguf_file
    t = gguf.GGMLQuantizationType[qtype]
    blocks = random_blocks(4096, block_bytes, seed=block_bytes)
    want = np.asarray(gguf.quants.dequantize(blocks, t), np.float32)
    got = getattr(gguf_file, decode)(blocks)                  # (n, 32)
    assert got.dtype == np.float32 and got.shape == (4096, QK)
    assert np.array_equal(got.view(np.int32), want.reshape(4096, QK)
                          .view(np.int32))


@pytest.mark.parametrize("qtype", ["Q4_1", "Q8_0"])
def test_dequantize_of_a_written_file_equals_gguf_quants(tmp_path, qtype):
    t = gguf.GGMLQuantizationType[qtype]
    block_bytes = Q4_1_BLOCK_BYTES if qtype == "Q4_1" else 2 + QK
    rows, cols = 48, 4 * QK                     # (R, C), 4 blocks a row
    blocks = random_blocks(rows * 4, block_bytes, seed=7)
    path = tmp_path / "blocks.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tensor("w", blocks.reshape(rows, 4 * block_bytes),
                      raw_dtype=t)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    f = GGUFFile(path)
    assert f.tensors[0].shape == (rows, cols)
    want = torch.from_numpy(np.asarray(gguf.quants.dequantize(
        blocks.reshape(rows, -1), t), np.float32))
    got = f.dequantize("w")
    assert got.shape == (rows, cols)
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))
