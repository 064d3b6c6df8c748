"""Chapter 14 benchmark: the all-to-all of expert parallelism.

One MoE layer (:class:`course_lib.distributed.expert_parallel.ExpertParallelMoE`) on
2 and 4 local gloo ranks of one :class:`course_lib.distributed.launch.Pool`:
bytes per layer from the counters (all ranks, dispatch plus combine, and
the part that leaves its rank) against the closed form $2NkDb$, and the
time spent inside the two all-to-alls per layer (median over forwards of
the slowest rank). ``rows()`` returns markdown lines for
benchmarks/results.md. Run alone: ``python benchmarks/all_to_all_bench.py``.
"""
from __future__ import annotations

import os
import statistics

from course_lib.distributed import scaling_experiments
from course_lib.distributed.expert_parallel import all_to_all_bytes
from course_lib.distributed.launch import Pool

N_TOKENS = 1024          # tokens per rank
D_MODEL = 256
N_EXPERTS, TOP_K, D_EXPERT = 8, 2, 64
REPEATS = 7
SIZES = (2, 4)


def measure(pool: Pool, size: int) -> dict:
    res = pool.run(scaling_experiments.expert_parallel_run, size, n_tokens=N_TOKENS,
                   d_model=D_MODEL, n_experts=N_EXPERTS, top_k=TOP_K,
                   d_expert=D_EXPERT, repeats=REPEATS)
    res = [r for r in res if r]
    last = [r["stats"][-1] for r in res]
    comm = [max(r["stats"][i].dispatch_seconds + r["stats"][i].combine_seconds
                for r in res) for i in range(1, REPEATS)]   # skip warm-up
    fwd = [max(r["stats"][i].forward_seconds for r in res)
           for i in range(1, REPEATS)]
    return {"bytes": sum(s.bytes_sent for s in last),
            "remote": sum(s.remote_bytes_sent for s in last),
            "formula": all_to_all_bytes(size * N_TOKENS, TOP_K, D_MODEL, 4),
            "uniform_remote": all_to_all_bytes(size * N_TOKENS, TOP_K,
                                               D_MODEL, 4, world_size=size),
            "comm_ms": 1e3 * statistics.median(comm),
            "forward_ms": 1e3 * statistics.median(fwd),
            "max_diff": max(r["max_diff"] for r in res)}


def rows() -> list[str]:
    load = os.getloadavg()[0]
    with Pool(max(SIZES)) as pool:
        startup = pool.startup_seconds
        results = {size: measure(pool, size) for size in SIZES}
    out = ["", "## Chapter 14: the all-to-all of expert parallelism (CPU, "
           "gloo, one run)", "",
           f"One MoE layer, {N_TOKENS} tokens per rank of width {D_MODEL} "
           f"(float32), {N_EXPERTS} experts of width {D_EXPERT}, k = "
           f"{TOP_K}, on local gloo ranks of one `Pool` (start-up "
           f"{startup:.1f} s for 4 ranks). Bytes from the counters, summed "
           f"over ranks (dispatch + combine); *remote*: without the slots a "
           f"rank keeps. Time: median over {REPEATS - 1} forwards (after a "
           f"warm-up) of the slowest rank's time inside the two "
           f"all-to-alls, and of the whole layer. Load average "
           f"{load:.2f} at the start.", "",
           "| ranks | bytes per layer | 2NkDb | remote bytes | uniform "
           "(W-1)/W | all-to-alls (ms) | layer (ms) | max diff vs MoE |",
           "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for size, r in results.items():
        out.append(f"| {size} | {r['bytes']:,} | {r['formula']:,} | "
                   f"{r['remote']:,} | {r['uniform_remote']:,.0f} | "
                   f"{r['comm_ms']:.1f} | {r['forward_ms']:.1f} | "
                   f"{r['max_diff']:.1e} |")
    return out


if __name__ == "__main__":
    print("\n".join(rows()))
