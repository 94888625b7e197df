"""The distilled draft and its training loop, on a tiny random Llama target (CPU, no network)."""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

from dynatree.training import distill as D
from dynatree.training import data as DD
from dynatree.drafts import distilled as R
from dynatree.drafts.checkpoint import load_distilled_draft
from dynatree.errors import DynaTreeError
from dynatree.text.prose import training_paragraphs

VOCAB = 260
EOS = 256


class ByteTokenizer:
    """Bytes as token ids; no chat template, so only raw prompts are built."""

    eos_token_id = EOS
    chat_template = None

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return list(text.encode("utf-8"))


def tiny_target(seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                      max_position_embeddings=256, tie_word_embeddings=True, pad_token_id=None,
                      bos_token_id=None, eos_token_id=EOS)
    return LlamaForCausalLM(cfg).eval()


DOCS = [DD.Text(f"doc{i}", " ".join(f"w{n}" for n in random.Random(i).sample(range(10**6), 90)))
        for i in range(12)]
SMALL = dict(layers=1, vocab_subset=48, batch=4, seq_len=20, prompt_tokens=16, new_tokens=8,
             train_sequences=16, eval_sequences=4, gen_batch=8, holdout_every=3, top_k=4,
             warmup=2, lr=3e-3, eval_every=4, checkpoint_every=4)


def make_draft(target: LlamaForCausalLM, subset: list[int], layers: int = 2) -> R.DistilledDraft:
    cfg = R.DraftConfig.from_target(target, name="tiny", layers=layers, vocab_subset=subset)
    draft = R.DistilledDraft(cfg, target.get_input_embeddings())
    draft.init_from_target(target)
    return draft.eval()


def causal_mask(q: int, past: int) -> torch.Tensor:
    allowed = torch.ones(q, past + q, dtype=torch.bool).tril(past)
    return torch.zeros(1, 1, q, past + q).masked_fill(~allowed, torch.finfo(torch.float32).min)


def test_full_vocab_logits_and_subset_always_wins() -> None:
    target = tiny_target()
    subset = list(range(3, VOCAB, 5))
    draft = make_draft(target, subset)
    with torch.no_grad():
        logits = draft(input_ids=torch.randint(VOCAB, (2, 9))).logits
    assert logits.shape == (2, 9, VOCAB)
    assert torch.isfinite(logits).all()
    assert torch.isin(logits.argmax(-1), torch.tensor(subset)).all()
    outside = torch.ones(VOCAB, dtype=torch.bool)
    outside[subset] = False
    assert (logits[..., outside] < -1e30).all()
    assert torch.isfinite(torch.log_softmax(logits, -1)).all()


def test_embedding_is_shared_not_owned() -> None:
    target = tiny_target()
    draft = make_draft(target, list(range(VOCAB)))
    emb = target.get_input_embeddings().weight
    assert draft.get_input_embeddings().weight.data_ptr() == emb.data_ptr()
    assert all(p.data_ptr() != emb.data_ptr() for p in draft.parameters())
    assert not any("embed" in k for k in draft.trainable_state_dict())
    assert draft.config.vocab_size == VOCAB and draft.config.num_hidden_layers == 2


def test_initialised_draft_is_the_target_early_exit() -> None:
    """With all layers and the full vocabulary, the initial draft equals the target."""
    target = tiny_target()
    draft = make_draft(target, list(range(VOCAB)), layers=3)
    ids = torch.randint(VOCAB, (1, 12))
    with torch.no_grad():
        torch.testing.assert_close(draft(input_ids=ids).logits, target(input_ids=ids).logits)


def test_tree_mask_and_cache_match_a_full_run() -> None:
    target = tiny_target()
    draft = make_draft(target, list(range(0, VOCAB, 2)))
    ids = torch.randint(VOCAB, (1, 10))
    with torch.no_grad():
        full = draft(input_ids=ids).logits
        cache = DynamicCache(config=draft.config)
        first = draft(input_ids=ids[:, :6], attention_mask=causal_mask(6, 0),
                      position_ids=torch.arange(6)[None], past_key_values=cache,
                      cache_position=torch.arange(6), use_cache=True)
        second = draft(input_ids=ids[:, 6:], attention_mask=causal_mask(4, 6),
                       position_ids=torch.arange(6, 10)[None], past_key_values=cache,
                       cache_position=torch.arange(6, 10), use_cache=True)
        torch.testing.assert_close(torch.cat([first.logits, second.logits], 1), full)
        # two siblings at the same depth: each sees the prefix and itself only
        a, b = 17, 42
        cache.crop(-4)  # drop the 4 rows after the 6-token prefix
        tree = torch.zeros(1, 1, 2, 8)
        tree[..., 0, 7] = tree[..., 1, 6] = torch.finfo(torch.float32).min
        sib = draft(input_ids=torch.tensor([[a, b]]), attention_mask=tree,
                    position_ids=torch.tensor([[6, 6]]), past_key_values=cache,
                    cache_position=torch.arange(6, 8), use_cache=True).logits
        for j, tok in enumerate((a, b)):
            alone = draft(input_ids=torch.cat([ids[:, :6], torch.tensor([[tok]])], 1)).logits
            torch.testing.assert_close(sib[0, j], alone[0, -1])
        kept = draft(input_ids=ids[:, :2], logits_to_keep=1).logits
        assert kept.shape == (1, 1, VOCAB)


def test_fingerprint_mismatch_raises(tmp_path: Path) -> None:
    target, other = tiny_target(0), tiny_target(1)
    draft = make_draft(target, list(range(0, VOCAB, 3)))
    R.save_draft(draft, tmp_path)
    loaded = load_distilled_draft(target, tmp_path)
    ids = torch.randint(VOCAB, (1, 7))
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids).logits, draft(input_ids=ids).logits,
                                   atol=2e-2, rtol=2e-2)  # fp16 file
    with pytest.raises(DynaTreeError, match="distilled for target 'tiny'"):
        load_distilled_draft(other, tmp_path)
    # the same target in another dtype is still recognised
    load_distilled_draft(tiny_target(0).to(torch.bfloat16), tmp_path)


def test_config_validation() -> None:
    with pytest.raises(DynaTreeError):
        D.DistillConfig(seq_len=500, prompt_tokens=96, new_tokens=64)
    with pytest.raises(DynaTreeError):
        D.DistillConfig(steps=0)
    target = tiny_target()
    good = R.DraftConfig.from_target(target, name="t", layers=1, vocab_subset=[1, 5])
    with pytest.raises(ValueError, match="strictly increasing"):
        dataclasses.replace(good, vocab_subset=(5, 5))
    with pytest.raises(ValueError, match="must lie in"):
        dataclasses.replace(good, vocab_subset=(1, VOCAB))
    with pytest.raises(ValueError, match="not be empty"):
        R.DraftConfig.from_target(target, name="t", layers=1, vocab_subset=[])
    with pytest.raises(DynaTreeError, match="more layers"):
        R.DraftConfig.from_target(target, name="t", layers=4, vocab_subset=[1])


def _log_steps(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / D.LOG_FILE).read_text().splitlines()]


def test_training_reduces_loss_and_resume_matches_uninterrupted(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tiny_target()
    cfg = D.DistillConfig(steps=8, **SMALL)
    straight = D.distill(target, ByteTokenizer(), out_dir=tmp_path / "a", config=cfg,
                         documents=DOCS, target_name="tiny", progress=False)
    log = _log_steps(tmp_path / "a")
    assert [r["step"] for r in log] == list(range(1, 9))
    assert sum(r["loss"] for r in log[-3:]) < sum(r["loss"] for r in log[:3])
    assert "eval" in log[3] and "eval" in log[7]
    assert target.get_input_embeddings().weight.grad is None, "the shared embedding must stay frozen"

    real_step = D._train_step
    calls = {"n": 0}

    def crash_at_sixth(*args: object) -> tuple[float, float]:
        calls["n"] += 1
        if calls["n"] == 6:
            raise KeyboardInterrupt
        return real_step(*args)

    monkeypatch.setattr(D, "_train_step", crash_at_sixth)
    with pytest.raises(KeyboardInterrupt):
        D.distill(target, ByteTokenizer(), out_dir=tmp_path / "b", config=cfg, documents=DOCS,
                  target_name="tiny", progress=False)
    assert not (tmp_path / "b" / D.FINAL_DIR).exists()
    calls["n"] = -100  # no more crashes; count the steps the resumed run takes
    resumed = D.distill(target, ByteTokenizer(), out_dir=tmp_path / "b", config=cfg,
                        documents=DOCS, target_name="tiny", progress=False)
    assert calls["n"] == -100 + 4, "resume must continue at the step-4 checkpoint"
    assert [r["step"] for r in _log_steps(tmp_path / "b")] == list(range(1, 9))
    a, b = load_file(str(straight / R.WEIGHTS_FILE)), load_file(str(resumed / R.WEIGHTS_FILE))
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k

    with pytest.raises(DynaTreeError, match="other settings"):
        D.distill(target, ByteTokenizer(), out_dir=tmp_path / "b",
                  config=D.DistillConfig(steps=9, **SMALL), documents=DOCS, target_name="tiny",
                  progress=False)


def test_prompts_are_held_out_by_document() -> None:
    cfg = D.DistillConfig(steps=1, **SMALL)
    prompts = DD.build_prompts(ByteTokenizer(), DOCS, cfg)
    assert prompts.train.shape == (16, 16) and prompts.eval.shape == (4, 16)
    held = {tuple(ByteTokenizer().encode(d.text)) for d in DOCS if DD.is_held_out(d.name, 3)}
    assert held and len(held) < len(DOCS)
    for row in prompts.eval.tolist():
        assert any(_contains(doc, row) for doc in held)
    for row in prompts.train.tolist():
        assert not any(_contains(doc, row) for doc in held)


def _contains(seq: tuple[int, ...], window: list[int]) -> bool:
    n = len(window)
    return any(list(seq[i:i + n]) == window for i in range(len(seq) - n + 1))


def test_prose_cleaning_drops_code_and_grammar() -> None:
    text = ("Heading\n*******\n\nThis paragraph explains what the statement does and why it "
            "matters to the reader of the documentation.\n\n   x = 1\n   y = 2\n\n"
            "stmt ::= expr \"=\" expr and a long enough line to pass the length filter here")
    assert training_paragraphs(text) == [
        "This paragraph explains what the statement does and why it matters to the reader of "
        "the documentation."]


def test_corpora_setting_selects_documents_and_is_validated(monkeypatch: pytest.MonkeyPatch) -> None:
    from dynatree.text import corpora

    with pytest.raises(DynaTreeError, match="corpora must be"):
        D.DistillConfig(corpora="pydoc,nope")
    assert "corpora" in D.DistillConfig().data_key()  # other corpora -> other labelled data
    pydoc = DD.documents_for("pydoc")
    assert pydoc and all(d.name.startswith("pydoc/") for d in pydoc)
    wiki = [DD.Text("wiki/A", "alpha"), DD.Text("wiki/B", "beta")]
    monkeypatch.setattr(corpora, "load", lambda name, root=None: wiki if name == "wiki" else [])
    assert DD.documents_for("wiki") == wiki
    both = DD.documents_for("pydoc,wiki")
    assert both[-2:] == wiki and len(both) == len(pydoc) + 2


def test_a_distilled_folder_is_a_draft_spec(tmp_path: Path) -> None:
    """What `dynatree distill` writes is usable as `--draft FOLDER` (it used to be taken for an
    HF model folder and fail on the missing tokenizer); an HF model folder is not mistaken for it."""
    from dynatree.loading.models import _is_distilled_folder, resolve_draft

    target = tiny_target(0)
    draft = make_draft(target, list(range(0, VOCAB, 3)))
    R.save_draft(draft, tmp_path / "final")
    loaded = resolve_draft(str(tmp_path / "final"), target)
    assert isinstance(loaded, R.DistilledDraft) and loaded.draft_config.vocab_subset == draft.draft_config.vocab_subset
    target.save_pretrained(tmp_path / "hf")
    assert not _is_distilled_folder(str(tmp_path / "hf")) and not _is_distilled_folder(str(tmp_path / "none"))


def test_warm_start_keeps_the_source_draft_where_subsets_overlap(tmp_path: Path) -> None:
    """``init=``: layers and norm come from the source draft, head rows of shared tokens too; the
    rows of tokens new to the subset keep their start from the target's embedding."""
    target = tiny_target()
    source = make_draft(target, list(range(10, 60)), layers=1)
    with torch.no_grad():  # a "trained" source: anything but the target's own start
        for p in source.parameters():
            p.add_(torch.randn_like(p))
    fresh = make_draft(target, list(range(40, 90)), layers=1)
    warm = make_draft(target, list(range(40, 90)), layers=1)
    assert D.warm_start(warm, source) == 20  # tokens 40..59 are in both subsets
    assert torch.equal(warm.head.weight[:20], source.head.weight[30:])
    assert torch.equal(warm.head.weight[20:], fresh.head.weight[20:])
    ids = torch.randint(VOCAB, (1, 7))
    with torch.no_grad():  # same layers: the hidden states of both are the source's
        assert torch.allclose(warm.hidden_states(ids)[0], source.hidden_states(ids)[0])
        assert not torch.allclose(fresh.hidden_states(ids)[0], source.hidden_states(ids)[0])
    with pytest.raises(DynaTreeError, match="pass --layers 1"):
        D.warm_start(make_draft(target, list(range(40, 90)), layers=2), source)


def test_distill_with_init_starts_from_the_given_draft(tmp_path: Path) -> None:
    """A run with ``init=`` scores at step 0 like its source would, on the same subset; without it the
    draft starts from the target's early exit, so the first losses differ."""
    target = tiny_target()
    first = D.distill(target, ByteTokenizer(), out_dir=tmp_path / "a", config=D.DistillConfig(steps=8, **SMALL),
                      documents=DOCS, target_name="tiny", progress=False)
    cfg = D.DistillConfig(steps=1, **SMALL, init=str(first))
    D.distill(target, ByteTokenizer(), out_dir=tmp_path / "b", config=cfg, documents=DOCS,
              target_name="tiny", progress=False)
    cold = D.DistillConfig(steps=1, **SMALL)
    D.distill(target, ByteTokenizer(), out_dir=tmp_path / "c", config=cold, documents=DOCS,
              target_name="tiny", progress=False)
    trained = _log_steps(tmp_path / "a")[-1]["loss"]
    warm_first, cold_first = _log_steps(tmp_path / "b")[0]["loss"], _log_steps(tmp_path / "c")[0]["loss"]
    assert abs(warm_first - trained) < abs(cold_first - trained)
    with pytest.raises(DynaTreeError, match="no distilled draft"):
        D.distill(target, ByteTokenizer(), out_dir=tmp_path / "d", config=dataclasses.replace(cfg, init=str(tmp_path)),
                  documents=DOCS, target_name="tiny", progress=False)
    with pytest.raises(DynaTreeError, match="independent drafts only"):
        D.DistillConfig(kind="feature", init=str(first))
