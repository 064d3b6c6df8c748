"""Packing documents into rows: positions, the document mask, and the
packed logits against each document run alone."""
import pytest
import torch

from course_lib.model.decoder_lm import DecoderLM, DecoderLMConfig
from course_lib.model.masks import causal_mask
from course_lib.tasks.packing import (document_causal_mask, pack_documents,
                                      packed_forward)


def _docs(lengths, vocab=50, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(vocab, (n,), generator=g) for n in lengths]


def test_pack_documents_layout():
    docs = _docs([5, 3, 7, 4, 9, 2])
    p = pack_documents(docs, 16, pad_id=0)
    assert p.spans == [(0, 0, 5), (0, 5, 8), (0, 8, 15), (1, 0, 4),
                       (1, 4, 13), (1, 13, 15)]
    for k, (doc, (r, s, e)) in enumerate(zip(docs, p.spans)):
        assert torch.equal(p.input_ids[r, s:e], doc)
        assert p.position_ids[r, s:e].tolist() == list(range(e - s))
        assert (p.document_ids[r, s:e] == k).all()
    assert p.document_ids[:, 15].tolist() == [-1, -1]      # padding
    assert p.input_ids[:, 15].tolist() == [0, 0]


def test_document_causal_mask_matches_loop():
    ids = torch.tensor([[0, 0, 1, 1, 1, 2], [3, 3, 3, 3, -1, -1]])
    m = document_causal_mask(ids)
    for b in range(2):
        for i in range(6):
            for j in range(6):
                assert m[b, i, j].item() == (j <= i and
                                             ids[b, i] == ids[b, j])


@pytest.mark.parametrize("position", ["rope", "learned"])
def test_packed_logits_equal_each_document_alone(position):
    torch.manual_seed(0)
    model = DecoderLM(DecoderLMConfig(
        vocab_size=50, hidden_size=32, num_attention_heads=4,
        num_hidden_layers=2, max_position_embeddings=16,
        position=position)).eval()
    docs = _docs([5, 3, 7, 4, 9, 2])
    p = pack_documents(docs, 16)
    with torch.no_grad():
        packed = packed_forward(model, p.input_ids, p.position_ids,
                                document_causal_mask(p.document_ids))
        plain = packed_forward(model, p.input_ids, p.position_ids,
                               causal_mask(16).expand(2, 16, 16))
        for doc, (r, s, e) in zip(docs, p.spans):
            alone = model(doc[None])[0]                       # (n, V)
            torch.testing.assert_close(packed[r, s:e], alone, atol=1e-5,
                                       rtol=0)
            if s > 0:     # a document after another one: causal leaks
                assert (plain[r, s:e] - alone).abs().max() > 1e-3
    # with one document per row, packed_forward is DecoderLM.forward
    with torch.no_grad():
        x = docs[2][None]
        pos = torch.arange(7)[None]
        torch.testing.assert_close(
            packed_forward(model, x, pos, causal_mask(7)[None]), model(x))


def test_packing_bad_input():
    docs = _docs([3, 4])
    with pytest.raises(TypeError, match="documents"):
        pack_documents(torch.zeros(3, dtype=torch.long), 8)
    with pytest.raises(ValueError, match="documents\\[1\\]"):
        pack_documents(docs, 3)
    with pytest.raises(ValueError, match="documents\\[0\\]"):
        pack_documents([torch.zeros(2)], 3)
    with pytest.raises(TypeError, match="row_length"):
        pack_documents(docs, 8.0)
    with pytest.raises(TypeError, match="document_ids"):
        document_causal_mask(torch.zeros(2, 3))
    with pytest.raises(ValueError, match="document_ids"):
        document_causal_mask(torch.zeros(3, dtype=torch.long))
    model = DecoderLM(DecoderLMConfig(vocab_size=10, hidden_size=8,
                                      num_attention_heads=2,
                                      num_hidden_layers=1))
    x = torch.zeros(1, 4, dtype=torch.long)
    with pytest.raises(TypeError, match="model"):
        packed_forward(None, x, x, causal_mask(4)[None])
    with pytest.raises(ValueError, match="mask"):
        packed_forward(model, x, x, causal_mask(4))
