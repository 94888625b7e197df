"""Loading a target sharded over ``torchrun`` processes (tensor parallelism) and its draft.

The lockstep runtime that decodes with such a target is :mod:`dynatree.runtime.distributed`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from dynatree import catalog
from dynatree.errors import DynaTreeError
from dynatree.loading import gguf, models
from dynatree.runtime.distributed import launched_by_torchrun, tp_plan


def load_tp_target(name_or_path: str, dtype: torch.dtype) -> tuple[torch.nn.Module, Any]:
    """Load a target sharded over the ``torchrun`` processes (tensor parallelism), and its tokenizer.

    Goes through :func:`dynatree.loading.models.load_model`'s name resolution (presets, the GGUF cache),
    then ``from_pretrained(..., distributed_config=DistributedConfig(tp_plan=...))``, which
    initialises the process group itself (gloo on CPU, NCCL on GPU).
    """
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.distributed import DistributedConfig

    if not launched_by_torchrun():
        raise DynaTreeError("--tp shards the target over processes: launch with "
                            "`torchrun --nproc-per-node N -m dynatree ... --tp`")
    source = models._resolve(name_or_path)
    if source.kind == "distilled-draft":
        raise DynaTreeError(f"'{name_or_path}' is a draft, not a target")
    location = str(gguf.ensure_gguf_cache(Path(source.location))) if source.kind == "gguf" else source.location
    world = int(os.environ["WORLD_SIZE"])
    plan = tp_plan(AutoConfig.from_pretrained(location), world)
    model = AutoModelForCausalLM.from_pretrained(
        location, dtype=dtype, attn_implementation="sdpa", distributed_config=DistributedConfig(tp_plan=plan))
    return model.eval(), AutoTokenizer.from_pretrained(location)


def load_tp_pair(target: str, draft: str, needs_draft: bool, dtype: torch.dtype, allow_vocab_mismatch: bool = False
                 ) -> tuple[torch.nn.Module, torch.nn.Module | None, Any, str | None]:
    """(sharded target, replicated draft, tokenizer, draft name) for the CLI's ``--tp``.

    The draft is an ordinary model on every rank. Drafts that share the target's tensors (the
    distilled draft shares its embedding, ``early-exit:K`` its first layers) are built on an
    unsharded copy of the target, so they stay replicated and run no collectives: fine for the
    small CPU pair, while a target too big for one device wants a separately loaded draft
    (``--draft org/name``), which is loaded once per rank on that rank's device.
    """
    tmodel, tok = load_tp_target(target, dtype)
    if not needs_draft:
        return tmodel, None, tok, None
    spec = catalog.DEFAULT_DRAFT if draft == "default" else draft
    device = tmodel.device
    if spec in catalog.SHIPPED_DRAFTS or spec.startswith(catalog.EARLY_EXIT_PREFIX):
        full, _ = models.load_model(target, dtype=dtype, device=device)
        return tmodel, models.resolve_draft(spec, full), tok, spec
    dmodel = models.resolve_draft(spec, tmodel, dtype=dtype, device=device, tokenizer=tok,
                                  allow_vocab_mismatch=allow_vocab_mismatch)
    return tmodel, dmodel, tok, spec
