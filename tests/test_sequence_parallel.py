"""Chapter 14: sequence parallelism (course_lib.distributed.sequence_parallel
and the chapter's worker sequence_parallel_run).

The layers are compared with the single-process DecoderBlock of the same
weights inside ``workers.check_sequence_parallel`` (under the meta
device, so a tensor made off the input's device fails) and the chapter's
worker; both run in the session's spawned groups of 2 and 4 ranks
(conftest fixture ``parallel_layers``, shared with the TP/EP tests).
"""
import pytest
import torch

from course_lib.distributed.sequence_parallel import (
    SequenceParallelBlock,
    SequenceParallelRowLinear,
    all_reduce_sequence_parallel_grads,
    gather_from_sequence_parallel,
    reduce_scatter_to_sequence_parallel,
    scatter_to_sequence_parallel,
)
from course_lib.distributed.tensor_parallel import TensorParallelAttention
from course_lib.model.block import DecoderBlock, FeedForward, SwiGLU
from course_lib.model.mha import MultiHeadAttention
from errors import error_for

TOL = 1e-5


@pytest.mark.distributed
@pytest.mark.parametrize("world_size", [2, 4])
def test_sequence_parallel_block_equals_single_process(parallel_layers,
                                                       world_size):
    """Outputs and input gradients on each rank's tokens, every weight
    shard's gradient, and the replicated norm weights and row biases
    after their all-reduce; with W = 4 also in two groups of 2."""
    for rank, res in enumerate(parallel_layers(world_size)):
        for key in ["sp"] + (["sp_pairs"] if world_size == 4 else []):
            for case, diffs in res[key].items():
                # norms' weights (2), with LayerNorm and biases also the
                # norms' biases and the two row-parallel biases (6)
                assert diffs.pop("n_replicated") == \
                    (2 if case == "rms" else 6)
                assert set(diffs) == {"out", "grad_x", "grad_shards",
                                      "grad_replicated"}
                for name, diff in diffs.items():
                    assert diff < TOL, (rank, key, case, name, diff)


@pytest.mark.distributed
@pytest.mark.parametrize("world_size", [2, 4])
def test_reduce_scatter_and_all_gather_replace_the_all_reduce(
        parallel_layers, world_size):
    """The chapter's run (B = 2, T = 16, D = 64): TP and SP both equal one
    process; where TP all-reduces, SP reduce-scatters and all-gathers the
    same tensor, so a ring sends the same bytes; the norms hold 1/W of
    their activations."""
    W, B, T, D = world_size, 2, 16, 64
    n = B * T * D * 4                         # one (B, T, D) float32 tensor
    for res in parallel_layers(W):
        tp, sp = res["sp_run"]["tp"], res["sp_run"]["sp"]
        for run in (tp, sp):
            assert run["out_diff"] < TOL and run["grad_diff"] < TOL
        assert sp["weight_grad_diff"] < TOL
        assert sp["replicated_grad_diff"] < TOL
        # attention, then FFN: one all-reduce each way per sub-layer ...
        assert [(c.op, c.n_bytes) for c in tp["forward"]] == \
            [("all_reduce", n)] * 2
        assert [(c.op, c.n_bytes) for c in tp["backward"]] == \
            [("all_reduce", n)] * 2
        # ... becomes an all-gather in and a reduce-scatter out (backward:
        # the reverse of each, in reverse order)
        assert [(c.op, c.n_bytes) for c in sp["forward"]] == \
            [("all_gather", n), ("reduce_scatter", n)] * 2
        assert [(c.op, c.n_bytes) for c in sp["backward"]] == \
            [("all_gather", n), ("reduce_scatter", n)] * 2
        for phase in ("forward", "backward"):
            tp_sent = sum(c.ring_bytes for c in tp[phase])
            assert tp_sent == 2 * 2 * (W - 1) / W * n
            assert sum(c.ring_bytes for c in sp[phase]) == tp_sent
        # the norms' outputs: all T tokens under TP, T/W under SP
        assert tp["norm_bytes"] == 2 * n and sp["norm_bytes"] * W == 2 * n
        # saved for the backward, per RMSNorm: its input x, 1/rms (B, T)
        # and x/rms (the weight's gradient), and its output (the
        # projections' input). Under SP the first three shrink to T/W and
        # the projections keep the all-gathered output instead: the two
        # norms save 2 (2 B T D + B T)(1 - 1/W) float32 fewer bytes
        saved = 2 * (2 * B * T * D + B * T) * (W - 1) // W * 4
        assert tp["saved_bytes"] - sp["saved_bytes"] == saved
        # the replicated gradients (two norm weights, W^O's bias) summed
        # in one all-reduce
        assert [(c.op, c.n_bytes) for c in sp["grad_sync"]] == \
            [("all_reduce", 3 * D * 4)]


def _block(norm="rms", bias=False):
    torch.manual_seed(0)
    return DecoderBlock(16, attention=MultiHeadAttention(16, 4, n_kv_heads=2,
                                                         bias=bias),
                        ffn=SwiGLU(16, 32, bias=bias), norm=norm)


def test_a_block_built_for_rank_1_of_2_holds_the_tp_shards():
    """Built without a process group (to inspect it): the attention keeps
    the TP shards, W^O's output is reduce-scattered, and the weights
    that act on this rank's tokens only are marked, in the copies."""
    block = _block("layer", bias=True)
    sp = SequenceParallelBlock(block, rank=1, world_size=2)
    tp = TensorParallelAttention(block.attention, rank=1, world_size=2)
    for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
        assert torch.equal(getattr(sp.attention, name).weight,
                           getattr(tp, name).weight)
    assert isinstance(sp.attention.o_proj, SequenceParallelRowLinear)
    assert isinstance(sp.ffn.down_proj, SequenceParallelRowLinear)
    marked = sorted(n for n, p in sp.named_parameters()
                    if getattr(p, "sequence_parallel", False))
    assert marked == ["attention.o_proj.bias", "ffn.down_proj.bias",
                      "norm1.bias", "norm1.weight", "norm2.bias",
                      "norm2.weight"]
    assert not any(hasattr(p, "sequence_parallel")
                   for p in block.parameters())
    # the forward needs the group it was built for
    with pytest.raises(RuntimeError, match="world_size=2 but no process "
                       "group"):
        sp(torch.randn(1, 4, 16))


def test_on_one_process_everything_is_the_identity():
    block = _block()
    sp = SequenceParallelBlock(block)
    x = torch.randn(2, 5, 16)
    for f in (scatter_to_sequence_parallel, gather_from_sequence_parallel,
              reduce_scatter_to_sequence_parallel):
        assert f(x) is x
    torch.testing.assert_close(sp(x), block(x), rtol=1e-5, atol=1e-6)
    sp(x).sum().backward()
    before = [p.grad.clone() for p in sp.parameters()]
    assert all_reduce_sequence_parallel_grads(sp) == 2 * 16   # norms
    assert all(torch.equal(a, p.grad) for a, p in zip(before,
                                                      sp.parameters()))


@pytest.mark.parametrize("call, match", [
    (lambda: gather_from_sequence_parallel(torch.zeros(3)),
     r"x must have a sequence axis \(B, T, ...\), got shape \(3,\)"),
    (lambda: scatter_to_sequence_parallel([1, 2]),
     "x must be a torch.Tensor"),
    (lambda: SequenceParallelBlock(_block())(torch.zeros(2, 3, 8)),
     r"x must have shape \(B, T/W, d_model=16\)"),
    (lambda: all_reduce_sequence_parallel_grads("model"),
     "module must be a torch.nn.Module"),
])
def test_bad_arguments_are_named(call, match):
    with pytest.raises(error_for(match), match=match):
        call()


def test_only_attention_and_swiglu_blocks_are_split():
    with pytest.raises(TypeError, match="block.ffn must be a course_lib "
                       "SwiGLU"):
        SequenceParallelBlock(DecoderBlock(
            16, attention=MultiHeadAttention(16, 4), ffn=FeedForward(16, 32)))
    with pytest.raises(TypeError, match="block must be a course_lib "
                       "DecoderBlock"):
        SequenceParallelBlock("block")
