"""The documentation's toy draft source (docs/draft-sources.md, "A draft source of your own"; it
was the README's) runs as printed: registered from outside the package, it drives generate()
without the loop knowing its kind, and the output stays the target's own."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from tiny import tiny_model

from dynatree import StoppingConfig, generate
from dynatree.drafts import registry

README = Path(__file__).resolve().parents[2] / "docs" / "draft-sources.md"  # the page that prints the block
NEVER = StoppingConfig(eos_token_id=())


def readme_block() -> str:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    (block,) = [b for b in blocks if "class PhraseSource(Proposer)" in b]
    return block


def load(source: str) -> dict:
    namespace: dict = {}
    exec(compile(source, str(README), "exec"), namespace)  # noqa: S102 - the docs' own example
    return namespace


@pytest.fixture
def sources(monkeypatch):
    """The registry as it was after the test (the docs block registers its source)."""
    monkeypatch.setattr(registry, "PROPOSERS", list(registry.PROPOSERS))


def run(source: str) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(AR output, output with the docs' source, most nodes accepted in one round)."""
    space = load(source)
    target = tiny_model("llama")
    prompt = [5, 9, 14, 3, 22, 7]
    ref = generate(target, None, prompt, "autoregressive", max_new_tokens=40, stopping=NEVER).sequences
    phrase = ref[0, len(prompt) + 12:len(prompt) + 20].tolist()  # what the target writes at step 12
    out = generate(target, space["Phrase"](phrase), prompt, max_new_tokens=40, stopping=NEVER, text=False)
    return ref, out.sequences, max(r.accepted for r in out.stats.rounds)


def test_the_readme_source_is_registered_and_exact(sources):
    ref, out, best = run(readme_block())
    assert registry.PROPOSERS[0].name == "phrase"
    assert torch.equal(out, ref)
    assert best >= 6  # the phrase's continuation was proposed where the text reached its start


def test_control_a_source_that_loses_the_bonus_token_stops_matching(sources):
    broken = readme_block().replace("committed_tokens(outcome.tree, list(outcome.accepted), outcome.bonus)",
                                    "committed_tokens(outcome.tree, list(outcome.accepted), outcome.bonus)[:-1]")
    assert broken != readme_block()
    ref, out, best = run(broken)
    assert torch.equal(out, ref)  # (verification keeps any source exact)
    assert best < 6


def test_register_refuses_what_is_not_a_source(sources):
    from dynatree.errors import DynaTreeError

    with pytest.raises(DynaTreeError, match="Proposer subclass"):
        registry.register(object)
