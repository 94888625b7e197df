"""What keeping the ranks in lockstep costs, per round, on the gloo backend (CPU).

Two ways to make every rank take the same random decisions (``dynatree.runtime.distributed``):

* shared stream (what the engine does): rank 0's generator state is broadcast once per run, and
  rank 0's round decision (accepted path + bonus, plus its generator state when the run draws random
  numbers) once per round: ONE broadcast per round;
* decisions on rank 0: every random draw (each DySpec child, each verifier draw) made on rank 0 and
  broadcast: one broadcast per draw.

This times one broadcast of each payload, and counts the draws per round of a DySpec run on the
tiny test models, so the per-round cost of both schemes can be compared.

Run: OMP_NUM_THREADS=1 PYTHONPATH=src:tests torchrun --nproc-per-node 2 benchmarks/tp/sync_cost.py
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

REPS = 2000


def timed(buf: torch.Tensor) -> float:
    """Median seconds of one broadcast of ``buf`` from rank 0 (barrier-separated batches)."""
    times = []
    for _ in range(20):
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(REPS // 20):
            dist.broadcast(buf, src=0)
        times.append((time.perf_counter() - t0) / (REPS // 20))
    return sorted(times)[len(times) // 2]


def draws_per_round() -> float:
    """Random draws per round of a sampled DySpec run (24 nodes) on the tiny Llama pair, unsharded."""
    import dynatree
    import dynatree.core.verify  # (patched below; generate imports it only when first called)
    from dynatree.core import sampling
    from tiny import perturbed, tiny_model

    count = 0
    original = sampling.uniform

    def counting(generator: torch.Generator) -> float:
        nonlocal count
        count += 1
        return original(generator)

    sampling.uniform = counting
    dynatree.core.verify.uniform = counting  # the verifier imported it by name
    target = tiny_model("llama", 0, max_positions=256)
    out = dynatree.generate(target, perturbed(target), torch.tensor([[5, 17, 33, 8]]), "dyspec", max_new_tokens=64,
                            stopping=dynatree.StoppingConfig(eos_token_id=()),
                            sampling=dynatree.SamplingConfig(temperature=0.8), seed=0, max_nodes=24)
    sampling.uniform = original
    dynatree.core.verify.uniform = original
    return count / out.stats.num_rounds


def main() -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    decision = torch.zeros(8, dtype=torch.long)  # path of up to 6 nodes + length + bonus
    state = torch.Generator().get_state()
    with_state = torch.cat((decision.view(torch.uint8), state))
    one_draw = torch.zeros(1, dtype=torch.float64)
    t_decision, t_state, t_draw = timed(decision), timed(with_state), timed(one_draw)
    if rank == 0:
        draws = draws_per_round()
        print(f"gloo broadcast, 2 processes x 1 thread: decision {t_decision * 1e6:.0f} us, decision + generator "
              f"state ({with_state.numel()} B) {t_state * 1e6:.0f} us, one draw {t_draw * 1e6:.0f} us")
        print(f"DySpec (24 nodes, sampled) draws per round: {draws:.1f}")
        print(f"per round: shared stream {t_state * 1e6:.0f} us vs decisions on rank 0 {draws * t_draw * 1e6:.0f} us")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
