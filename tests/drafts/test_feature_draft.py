"""The feature-conditioned draft head: its engine plumbing, its training passes, and exactness.

Exactness never depends on the draft (the target verifies every token), so what these tests pin
down is that the head gets what it was trained on: the target's feature of each committed token's
parent, its own predicted feature inside the tree, and training levels that attend exactly like a
chain drafted at run time. Each check is also run on a deliberately broken variant.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import DynamicCache

from dynatree.training import features as F
from dynatree.loop import generate as E
from dynatree import generate
from dynatree.training.config import DistillConfig
from dynatree.drafts.checkpoint import load_distilled_draft
from dynatree.drafts.distilled import DraftConfig
from dynatree.drafts.feature import FeatureProposer
from dynatree.errors import DynaTreeError
from dynatree.options import EngineOptions, StoppingConfig
from dynatree.drafts.feature_head import FeatureDraft
from test_distill import DOCS, SMALL, ByteTokenizer, tiny_target
from tiny import SMALL_TREES, tiny_model

PROMPT = torch.tensor([[3, 17, 42, 5, 9, 11, 23]])
NO_EOS = StoppingConfig(eos_token_id=())


def feature_draft(target: torch.nn.Module, seed: int = 0, layers: tuple[int, ...] = ()) -> FeatureDraft:
    vocab = target.config.vocab_size
    cfg = DraftConfig.from_target(target, name="tiny", layers=1, vocab_subset=list(range(0, vocab, 2)), kind="feature",
                                  feature_layers=layers)
    draft = FeatureDraft(cfg, target.get_input_embeddings())
    draft.init_from_target(target)
    torch.manual_seed(seed)
    with torch.no_grad():  # a random fc (and fuse) so that features visibly change the draft's output
        draft.fc.weight.normal_(std=0.3)
        if draft.fuse is not None:
            draft.fuse.weight.normal_(std=0.3)
    return draft.eval()


FUSED = (1, 2)  # of a 3-layer tiny target: the outputs of its first two decoder layers


@pytest.mark.parametrize("engine", ["hf", "static"])
@pytest.mark.parametrize("strategy", list(SMALL_TREES))
def test_greedy_output_equals_autoregressive(strategy: str, engine: str) -> None:
    target = tiny_model("llama", 0)
    draft = feature_draft(target)
    ref = generate(target, None, PROMPT, "autoregressive", max_new_tokens=30, stopping=NO_EOS).sequences
    out = generate(target, draft, PROMPT, strategy, max_new_tokens=30, stopping=NO_EOS,
                   options=EngineOptions(engine=engine), **SMALL_TREES[strategy], text=False)
    assert torch.equal(out.sequences, ref)


@pytest.mark.parametrize("strategy", list(SMALL_TREES))
def test_fused_layers_greedy_output_equals_autoregressive(strategy: str) -> None:
    target = tiny_model("llama", 0, layers=3)
    draft = feature_draft(target, layers=FUSED)
    ref = generate(target, None, PROMPT, "autoregressive", max_new_tokens=30, stopping=NO_EOS).sequences
    out = generate(target, draft, PROMPT, strategy, max_new_tokens=30, stopping=NO_EOS, **SMALL_TREES[strategy], text=False)
    assert torch.equal(out.sequences, ref)


def test_fused_layers_refuse_the_static_engine_and_missing_layers() -> None:
    target = tiny_model("llama", 0, layers=3)
    with pytest.raises(DynaTreeError, match="hf engine"):
        generate(target, feature_draft(target, layers=FUSED), PROMPT, "linear", max_new_tokens=8,
                 options=EngineOptions(engine="static"), text=False)
    small = tiny_model("llama", 0, layers=2)
    draft = feature_draft(target, layers=FUSED)
    with pytest.raises(DynaTreeError, match="reads layers"):
        generate(small, draft, PROMPT, "linear", max_new_tokens=8, text=False)


def _pending_features_are_the_targets(monkeypatch: pytest.MonkeyPatch, corrupt: bool,
                                      layers: tuple[int, ...] = ()) -> bool:
    """Run linear speculation while recording every round's pending tokens and their features;
    True when each equals the target's feature of the token before it (its final hidden state, or
    its fused ``layers`` as the head reads them)."""
    target = tiny_model("llama", 1, layers=3)
    draft = feature_draft(target, seed=1, layers=layers)
    seen: list[tuple[int, torch.Tensor]] = []
    begin = FeatureProposer.begin_round

    def record(self: FeatureProposer, builder: object) -> torch.Tensor:
        seen.append((self.kv.length, self.pending_features.clone()))
        return begin(self, builder)

    monkeypatch.setattr(FeatureProposer, "begin_round", record)
    if corrupt:  # hand the drafter the features of the wrong tree rows (shifted by one)
        forward = E.tree_forward

        def shifted(*args: object, **kwargs: object) -> tuple:
            logits, rows = forward(*args, **kwargs)
            logits.features = logits.features.roll(1, dims=0)
            return logits, rows

        monkeypatch.setattr(E, "tree_forward", shifted)
    seq = generate(target, draft, PROMPT, "linear", max_new_tokens=40, stopping=NO_EOS, k=3, text=False).sequences
    with torch.no_grad():
        out = target.base_model(input_ids=seq, output_hidden_states=True)
        ref = out.last_hidden_state[0] if not layers else \
            draft.parent_features(torch.cat([out.hidden_states[i][0] for i in layers], dim=-1))
    assert len(seen) > 5
    tol = 1e-5 * float(ref.abs().max()) + 1e-4  # (fused features reach a few hundred)
    return all(torch.allclose(feats, ref[start - 1:start - 1 + len(feats)], atol=tol) for start, feats in seen)


@pytest.mark.parametrize("layers", [(), FUSED])
def test_committed_tokens_get_the_targets_features(monkeypatch: pytest.MonkeyPatch, layers: tuple[int, ...]) -> None:
    assert _pending_features_are_the_targets(monkeypatch, corrupt=False, layers=layers)


@pytest.mark.parametrize("layers", [(), FUSED])
def test_feature_check_fails_on_wrong_rows(monkeypatch: pytest.MonkeyPatch, layers: tuple[int, ...]) -> None:
    assert not _pending_features_are_the_targets(monkeypatch, corrupt=True, layers=layers)


def _chain_error(draft: FeatureDraft, tokens: torch.Tensor, feats: torch.Tensor, levels: int) -> float:
    """Largest gap between :func:`F.unrolled_hidden` and chains drafted one token at a time with a cache."""
    parents = F._parents(feats)
    unrolled = F.unrolled_hidden(draft, tokens, parents, levels)
    err = 0.0
    for t in range(tokens.shape[1] - levels + 1):
        h, cache = draft.hidden_states(tokens[:, :t + 1], parents[:, :t + 1], past_key_values=DynamicCache(),
                                       use_cache=True)
        prev = h[:, -1]
        err = max(err, float((prev - unrolled[0][:, t]).abs().max()))
        for level in range(2, levels + 1):
            j = t + level - 1
            h, cache = draft.hidden_states(tokens[:, j:j + 1], prev[:, None], past_key_values=cache, use_cache=True,
                                           position_ids=torch.full((tokens.shape[0], 1), j))
            prev = h[:, -1]
            err = max(err, float((prev - unrolled[level - 1][:, j]).abs().max()))
    return err


@torch.no_grad()
def test_unrolled_training_levels_equal_drafted_chains(monkeypatch: pytest.MonkeyPatch) -> None:
    target = tiny_model("llama", 2)
    draft = feature_draft(target, seed=2)
    tokens = torch.randint(0, 96, (2, 12), generator=torch.Generator().manual_seed(0))
    feats = target.base_model(input_ids=tokens).last_hidden_state
    assert _chain_error(draft, tokens, feats, 4) < 1e-3
    # broken variant: deeper levels see every teacher-forced row before them (plain noise-style unroll)
    real = F.level_mask

    def leaky(length: int, level: int, dtype: torch.dtype, pad: object = None) -> torch.Tensor:
        mask = real(length, level, dtype)
        if level > 1:
            j, i = torch.arange(length)[:, None], torch.arange(length)[None, :]
            mask[:, :length].masked_fill_(i < j, 0.0)
        return mask

    monkeypatch.setattr(F, "level_mask", leaky)
    assert _chain_error(draft, tokens, feats, 4) > 0.1


ROWS = [[5, 9, 14, 3, 22, 40, 7, 81, 12, 6], [31, 2, 77, 18], [60, 61, 62, 63, 64, 65, 66]]


def _left_padded(rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(map(len, rows))
    tokens = torch.zeros(len(rows), width, dtype=torch.long)
    for s, row in enumerate(rows):
        tokens[s, width - len(row):] = torch.tensor(row)
    return tokens, torch.tensor([width - len(row) for row in rows])


@torch.no_grad()
@pytest.mark.parametrize("layers", [(), FUSED])
def test_padded_rows_get_the_features_of_the_row_alone(layers: tuple[int, ...]) -> None:
    """Left-padded instruct rows: each row's features equal its own unpadded forward's (the run-time
    features), and padding columns are zeros. Control: treating the padding as text changes them."""
    target = tiny_model("llama", 4, layers=3)
    tokens, start = _left_padded(ROWS)
    feats = F.target_features(target, tokens, start=start, layers=layers, batch=2, progress=False)
    assert feats.shape == (3, 10, 32 * max(1, len(layers)))
    for s, row in enumerate(ROWS):
        out = target.base_model(input_ids=torch.tensor([row]), output_hidden_states=True)
        alone = torch.cat([out.hidden_states[i][0] for i in layers], -1) if layers else out.last_hidden_state[0]
        assert torch.allclose(feats[s, int(start[s]):].float(), alone, rtol=3e-3, atol=1e-2)  # (fp16)
        assert not feats[s, : int(start[s])].any()
    unmasked = F.target_features(target, tokens, layers=layers, batch=2, progress=False)
    assert not torch.allclose(unmasked[1, 6:].float(), feats[1, 6:].float(), atol=2e-2)


class _Interrupt(Exception):
    pass


@torch.no_grad()
def test_an_interrupted_feature_pass_resumes_from_its_partial_file(tmp_path: Path, monkeypatch) -> None:
    """A pass stopped after its third batch resumes from ``partial`` at the batch after the last save
    and ends with the features of an uninterrupted pass; the early batches are not run again.
    Control: resuming with the partial file's ``next`` one batch late leaves a batch of zeros."""
    target = tiny_model("llama", 6, layers=3)
    rows = [[3 + (5 * s + j) % 40 for j in range(4 + s % 5)] for s in range(9)]
    tokens, start = _left_padded(rows)
    whole = F.target_features(target, tokens, start=start, layers=FUSED, batch=2, progress=False)
    partial = tmp_path / "features.partial.pt"
    calls = {"n": 0}
    forward = target.base_model.forward

    def stop_after_three(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] > 3:
            raise _Interrupt
        return forward(*args, **kwargs)

    monkeypatch.setattr(target.base_model, "forward", stop_after_three)
    with pytest.raises(_Interrupt):
        F.target_features(target, tokens, start=start, layers=FUSED, batch=2, partial=partial,
                          save_every_s=0.0, progress=False)
    assert int(torch.load(partial, weights_only=True)["next"]) == 6
    calls["n"] = -100
    resumed = F.target_features(target, tokens, start=start, layers=FUSED, batch=2, partial=partial,
                                save_every_s=0.0, progress=False)
    assert calls["n"] == -100 + 2  # batches 4 and 5 only
    assert torch.equal(resumed, whole)
    late = torch.load(partial, weights_only=True)
    late["next"] = 8
    late["features"][:] = 0  # (pretend only the first 6 rows' batches were kept, one batch too few)
    late["features"][torch.argsort(start, descending=True, stable=True)[:6]] = whole[
        torch.argsort(start, descending=True, stable=True)[:6]]
    torch.save(late, partial)
    skipped = F.target_features(target, tokens, start=start, layers=FUSED, batch=2, partial=partial,
                                save_every_s=0.0, progress=False)
    assert not torch.equal(skipped, whole)


@torch.no_grad()
def test_padded_unrolled_levels_equal_the_row_alone() -> None:
    """Every level of a left-padded batch, at the real columns, equals the levels of each row run
    alone: padding is hidden from every level. Control: without the real-column mask it is not."""
    target = tiny_model("llama", 5, layers=3)
    draft = feature_draft(target, seed=5, layers=FUSED)
    tokens, start = _left_padded(ROWS)
    feats = F.target_features(target, tokens, start=start, layers=FUSED, progress=False).float()
    real = torch.arange(tokens.shape[1])[None, :] >= start[:, None]

    def gap(mask: torch.Tensor | None) -> float:
        padded = F.unrolled_hidden(draft, tokens, draft.parent_features(F._parents(feats)), 3, mask)
        err = 0.0
        for s, row in enumerate(ROWS):
            c = int(start[s])
            alone = F.unrolled_hidden(draft, tokens[s:s + 1, c:], draft.parent_features(F._parents(feats[s:s + 1, c:])), 3)
            for d in range(3):  # level d+1's rows whose chain starts at a real column
                err = max(err, float((padded[d][s, c + d:] - alone[d][0, d:]).abs().max()))
        return err

    assert gap(real) < 1e-4
    assert gap(None) > 1e-2


def test_training_learns_resumes_and_loads(tmp_path: Path) -> None:
    target = tiny_target()
    cfg = DistillConfig(steps=8, kind="feature", feature_layers="final", unroll=2, **SMALL)
    final = F.distill_features(target, ByteTokenizer(), out_dir=tmp_path / "a", config=cfg, documents=DOCS,
                               target_name="tiny", progress=False)
    log = [json.loads(x) for x in (tmp_path / "a" / F.LOG_FILE).read_text().splitlines()]
    assert [r["step"] for r in log] == list(range(1, 9))
    assert sum(r["loss"] for r in log[-3:]) < sum(r["loss"] for r in log[:3])
    assert 1.0 <= log[-1]["eval"]["linear_k4_tokens"] <= 5.0
    assert target.get_input_embeddings().weight.grad is None, "the shared embedding must stay frozen"
    draft = load_distilled_draft(target, final)
    assert isinstance(draft, FeatureDraft) and draft.draft_config.kind == "feature"
    ref = generate(target, None, PROMPT, "autoregressive", max_new_tokens=12, stopping=NO_EOS).sequences
    assert torch.equal(generate(target, draft, PROMPT, "dynatree", max_new_tokens=12, stopping=NO_EOS, text=False).sequences, ref)
    # resuming a finished run trains no further step and gives the same weights
    again = F.distill_features(target, ByteTokenizer(), out_dir=tmp_path / "a", config=cfg, documents=DOCS,
                               target_name="tiny", progress=False)
    assert again == final
    with pytest.raises(DynaTreeError, match="kind='feature'"):
        F.distill_features(target, ByteTokenizer(), out_dir=tmp_path / "b", config=DistillConfig(**SMALL),
                           documents=DOCS, progress=False)


def test_refuses_kv_window() -> None:
    target = tiny_model("llama", 0)
    with pytest.raises(DynaTreeError, match="feature-conditioned draft"):
        generate(target, feature_draft(target), PROMPT, "linear", max_new_tokens=8,
                 options=EngineOptions(kv_window=16), text=False)


@pytest.mark.parametrize("strategy", ["dyspec", "dynatree"])
def test_sampled_tokens_follow_the_target(strategy: str) -> None:
    """Lossless sampling with a feature draft (one-token prompt: the drafter starts with no features)."""
    from test_sampling import ALPHA, STRATEGIES, T_MAIN, V, pvalues

    from dynatree.core.sampling import SamplingConfig

    target = tiny_model("llama", 3, vocab=V, layers=1, init=0.3)
    cfg = DraftConfig.from_target(target, name="tiny", layers=1, vocab_subset=list(range(V)), kind="feature")
    draft = FeatureDraft(cfg, target.get_input_embeddings())
    draft.init_from_target(target)
    with torch.no_grad():  # the target's own layer on the embedding, plus a small feature term:
        h = cfg.hidden_size  # a draft close to the target, so trees are accepted deep
        draft.fc.weight.zero_()
        draft.fc.weight[:, :h].copy_(torch.eye(h))
        draft.fc.weight[:, h:].normal_(std=0.05, generator=torch.Generator().manual_seed(0))
    opts = dict(STRATEGIES)[strategy]
    ps, deep = pvalues((target, draft.eval()), strategy, opts, SamplingConfig(T_MAIN))
    assert min(ps) >= ALPHA, f"{strategy}: p-values {ps}"
    assert deep >= 0.1, f"only {deep:.0%} of runs produced the 3rd token in the first round"


@pytest.mark.parametrize("layers", [(), FUSED])
@pytest.mark.parametrize("confident", [2.0, 1e9])
def test_hybrid_with_the_text_queues_features_of_skipped_rounds(confident: float, layers: tuple[int, ...]) -> None:
    """With the text deciding some rounds, the head runs the skipped tokens later with the target's
    features of those rounds (fused layers included); output stays the target's own."""
    from dynatree.drafts.suffix import TextDraft

    target = tiny_model("llama", 0, layers=3)
    prompt = torch.cat([PROMPT, PROMPT, PROMPT[:, :3]], dim=1)
    ref = generate(target, None, prompt, "autoregressive", max_new_tokens=40, stopping=NO_EOS).sequences
    draft = TextDraft(model=feature_draft(target, layers=layers), confident=confident, model_min_gain=0)
    out = generate(target, draft, prompt, "dynatree", max_new_tokens=40, stopping=NO_EOS, text=False)
    assert torch.equal(out.sequences, ref)
    assert sum(r.draft_calls for r in out.stats.rounds) > 0
