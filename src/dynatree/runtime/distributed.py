"""Targets bigger than one device: a tensor-parallel target over ``torch.distributed``.

A target sharded with transformers' tensor parallelism (``from_pretrained(..., tp_plan="auto")``
under ``torchrun``: weights are DTensors, every layer ends in a collective) runs the decoding loop
on *every* rank, in lockstep: each rank drafts with its own replicated draft, feeds the same tree
to its shard of the target, and the layers' all-reduces / all-gathers combine the shards. That is
only correct while every rank makes the same decisions; one rank that builds a different tree
feeds the collectives tensors of another shape and the run hangs (what DySpec did with an unseeded
generator: each rank drew different children). So:

* **one random stream**: :meth:`RankSync.share_generator` copies rank 0's generator state to every
  rank once per ``generate`` (the seeded generator, or torch's global one), so DySpec's child
  draws and the verifier's draws are the same numbers everywhere, with no collective per draw;
* **rank 0 decides the round**: :meth:`RankSync.decide` broadcasts rank 0's accepted path and
  bonus token (and, when the run draws random numbers, its generator state) once per round, so
  even logits that differed between ranks in the last bit (a near-tie under a non-deterministic
  reduction) could not make the ranks commit different tokens or fall out of step. One small
  broadcast per round, timed on CPU (gloo) against the alternative of broadcasting every random
  draw from rank 0.
* **no CPU-specific layout on sharded weights**: the few-row linear layout
  (:mod:`dynatree.runtime.kernels.cpu_linear`) returns a non-contiguous one-row output, and the row-wise
  layers' in-place all-reduce (gloo) then reduces a contiguous copy and drops the result, so the
  output is silently wrong. :func:`resolve_cpu_linear` keeps it off for sharded models and refuses
  an explicit ``cpu_linear=True``.

KV compaction needs nothing special: each rank's cache holds its local heads, and compaction
gathers rows along the sequence axis, which every shard shares. A target spread over devices with
accelerate's ``device_map`` (hooks moving activations) is handled by the cache code as is: the
tree mask and positions go to the model's input device and the hooks move them with the
activations; compaction indexes each cache layer on that layer's own device.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import torch

from dynatree.errors import DynaTreeError


def _dist() -> Any:
    """``torch.distributed`` when it is usable and initialised, else None."""
    import torch.distributed as dist

    return dist if dist.is_available() and dist.is_initialized() else None


def is_sharded(model: torch.nn.Module | None) -> bool:
    """True if ``model`` holds DTensor parameters (transformers' ``tp_plan``, or any DTensor sharding).

    Why DTensors and not ``torch.distributed.is_initialized()``: a replicated draft (or a
    data-parallel copy) on an initialised process group runs no collectives and needs nothing.
    """
    if model is None or _dist() is None:
        return False
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in model.parameters())


def resolve_cpu_linear(model: torch.nn.Module, cpu_linear: bool | None) -> bool | None:
    """``cpu_linear`` for a sharded ``model``: off, and an explicit True refused (see module doc).

    Returns None for an unsharded model (the caller's own default applies).
    """
    if not is_sharded(model):
        return None
    if cpu_linear:
        raise DynaTreeError(
            "cpu_linear=True is not supported on a tensor-parallel (DTensor) target: the few-row layout "
            "breaks the row-wise layers' all-reduce; leave cpu_linear unset (off for sharded models)"
        )
    return False


def layout_allowed(model: torch.nn.Module) -> bool:
    """Whether the few-row CPU layout may run inside ``model`` (never in a sharded one, whatever the
    caller resolved: also covers a sharded draft next to an unsharded target)."""
    return not is_sharded(model)


class RankSync:
    """Keeps the ranks of a sharded run in lockstep (see module doc). Collectives only, no state."""

    def __init__(self, group: Any = None) -> None:
        dist = _dist()
        assert dist is not None
        self.dist, self.group = dist, group
        self.rank = dist.get_rank(group)
        # NCCL broadcasts need CUDA tensors; gloo (CPU) takes CPU ones.
        nccl = dist.get_backend(group) == "nccl"
        self.device = torch.device("cuda", torch.cuda.current_device()) if nccl else torch.device("cpu")
        self.broadcasts = 0

    @classmethod
    def for_models(cls, *models: torch.nn.Module | None) -> "RankSync | None":
        """A syncer when any model is sharded over more than one process, else None (no cost)."""
        dist = _dist()
        if dist is None or dist.get_world_size() < 2 or not any(is_sharded(m) for m in models):
            return None
        return cls()

    def _broadcast(self, t: torch.Tensor) -> torch.Tensor:
        buf = t.to(self.device)
        self.dist.broadcast(buf, src=0, group=self.group)
        self.broadcasts += 1
        return buf.cpu()

    def share_generator(self, generator: torch.Generator) -> None:
        """Give every rank rank 0's generator state (its seed, or torch's global stream)."""
        generator.set_state(self._broadcast(generator.get_state()))

    def decide(self, path: Sequence[int], bonus: int, width: int,
               generator: torch.Generator | None = None) -> tuple[list[int], int]:
        """Rank 0's (path, bonus) on every rank; with ``generator``, rank 0's state after its draws too.

        ``width`` bounds the path length (the tree's depth): the same on every rank, so the buffer
        has one shape everywhere. One broadcast of a few bytes (plus the generator state, about
        5 KB, for runs that draw random numbers).
        """
        head = torch.full((width + 2,), -1, dtype=torch.long)
        head[0] = len(path)
        head[1 : 1 + len(path)] = torch.as_tensor(list(path), dtype=torch.long)
        head[1 + len(path)] = bonus
        buf = head.view(torch.uint8)
        if generator is not None:
            buf = torch.cat((buf, generator.get_state()))
        buf = self._broadcast(buf)
        head = buf[: head.numel() * 8].view(torch.long)
        if generator is not None:
            generator.set_state(buf[head.numel() * 8 :].clone())
        n = int(head[0])
        return head[1 : 1 + n].tolist(), int(head[1 + n])


# ------------------------------------------------------------------------------ loading (CLI)
def launched_by_torchrun() -> bool:
    """True inside a ``torchrun`` worker (it sets WORLD_SIZE and the rendezvous variables)."""
    return "WORLD_SIZE" in os.environ and "RANK" in os.environ


def rank() -> int:
    """This process's rank (0 when not distributed): who prints."""
    dist = _dist()
    return dist.get_rank() if dist is not None else int(os.environ.get("RANK", "0"))


def world_size() -> int:
    """Number of processes (1 when not distributed)."""
    dist = _dist()
    return dist.get_world_size() if dist is not None else int(os.environ.get("WORLD_SIZE", "1"))


def tp_plan(config: Any, world: int) -> str | dict[str, str]:
    """``"auto"``, or the model's plan with attention replicated when its heads do not split evenly.

    SmolLM2-135M has 9 query and 3 key/value heads: two ranks cannot split them, so attention is
    replicated and only the MLPs, the embedding and the LM head are sharded (transformers'
    ``"replicate"`` style). Any other shape error is left to transformers.
    """
    heads = getattr(config, "num_attention_heads", None)
    kv = getattr(config, "num_key_value_heads", None) or heads
    if heads is None or (heads % world == 0 and kv % world == 0):
        return "auto"
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    prefix = MODEL_FOR_CAUSAL_LM_MAPPING[type(config)].base_model_prefix
    return {f"{prefix}.layers.*.self_attn.{p}_proj": "replicate" for p in ("q", "k", "v", "o")}


def rank_output(output: "os.PathLike[str] | str", overwrite: bool) -> tuple[Any, bool]:
    """(results file this rank writes, whether it is rank 0) for ``bench --tp``.

    Every rank must run exactly the rows rank 0 runs (the target's collectives need all of them),
    and a resumed file decides which rows are skipped; so ranks other than 0 write to a private
    copy of the file as it was before anyone wrote (single node: the ranks share the disk), and
    only rank 0's file is the result. A barrier keeps rank 0 from appending before the copies exist.
    """
    import shutil
    import tempfile
    from pathlib import Path

    dist = _dist()
    path = Path(output)
    me = rank()
    if me == 0:
        mine = path
    else:
        mine = Path(tempfile.mkdtemp(prefix=f"dynatree-rank{me}-")) / path.name
        if path.exists() and not overwrite:
            shutil.copyfile(path, mine)
    if dist is not None:
        dist.barrier()
    return mine, me == 0
