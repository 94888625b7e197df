"""The exactness check can catch a wrong token: deliberately broken engines must fail it.

Each mutant is a classic tree-decoding bug injected with monkeypatch (nothing broken lives in the
library). For every mutant, at least one of a few ordinary configurations must produce output that
differs from HF greedy decoding; the unbroken engine passes the same check in test_exactness.py.
"""

from __future__ import annotations

import pytest
import torch

import dynatree
import dynatree.loop.generate
import dynatree.core.verify
from dynatree.runtime.cache import CachedModel
from tiny import ARCHS, perturbed, tiny_model

CONFIGS = [
    ("fixed", {"depth": 3, "branch": 2, "tau": 0.0, "max_nodes": 16}),
    ("dynatree", {"tau": 0.0, "max_nodes": 16}),
    ("linear", {"k": 4}),
]


def detected(arch: str) -> bool:
    target = tiny_model(arch, 0)
    draft = perturbed(target)
    ids = torch.randint(2, 90, (1, 6), generator=torch.Generator().manual_seed(4))
    ref = target.generate(ids, do_sample=False, max_new_tokens=40, eos_token_id=None, pad_token_id=0)
    for strategy, opts in CONFIGS:
        out = dynatree.generate(target, draft, ids, strategy, max_new_tokens=40,
                                stopping=dynatree.StoppingConfig(eos_token_id=()), **opts, text=False)
        if not torch.equal(out.sequences, ref):
            return True
    return False


def bfs_positions(depth: torch.Tensor, prefix_len: int) -> torch.Tensor:
    return (torch.arange(depth.numel()) + prefix_len).view(1, -1)


def skip_one_row(compact):
    def broken(self, start, keep):
        keep = list(keep)
        return compact(self, start, keep[:-1] if len(keep) > 1 else keep)

    return broken


def drop_bonus(truncate):
    def broken(new, room, stop):
        return truncate(new[:-1] if len(new) > 1 else new, room, stop)

    return broken


def causal_mask(parent: torch.Tensor, depth: torch.Tensor) -> torch.Tensor:
    return torch.ones(parent.numel(), parent.numel(), dtype=torch.bool).tril()


MUTANTS = {
    "bfs-index positions": ("position_ids", dynatree.core.verify, bfs_positions),
    "commit skips a KV row": ("compact", CachedModel, skip_one_row(CachedModel.compact)),
    "bonus token dropped": ("_truncate", dynatree.loop.generate, drop_bonus(dynatree.loop.generate._truncate)),
    "causal instead of tree mask": ("ancestor_matrix", dynatree.core.verify, causal_mask),
}


@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_mutant_is_caught(mutant: str, monkeypatch: pytest.MonkeyPatch) -> None:
    name, module, replacement = MUTANTS[mutant]
    monkeypatch.setattr(module, name, replacement)
    # GPT-2 (learned positions) and a RoPE model: a mutant must be caught on both kinds.
    assert detected("gpt2") and detected("llama"), f"mutant '{mutant}' was not detected"


def test_unbroken_engine_passes_the_same_check() -> None:
    assert not any(detected(arch) for arch in ARCHS)
