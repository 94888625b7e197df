"""Instruct training data (``DistillConfig(data="instruct")``): batched left-padded answering against
HF's own generation, padding never attended to in training, the held-out split (and that nothing the
bench holds out reaches training), resumable labelled data, and the mix with continuation data.

Tiny random Llama models and the tiny ChatML tokenizer of ``tests/tiny_tok.py``; the request pools
are built over a few stdlib modules (``small_stdlib``) except in the bench-overlap test, which
builds both sets in full.
"""

from __future__ import annotations

import dataclasses
import json
import random
import re
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from dynatree.drafts import distilled as R
from dynatree.errors import DynaTreeError
from dynatree.text import corpora
from dynatree.training import data as DD
from dynatree.training import distill as D
from dynatree.training import instruct as I
from dynatree.training import instruct_text as IT
from dynatree.training import labels as L
from dynatree.training.config import DistillConfig
from dynatree.training.split import SHINGLE, HeldOutText
from tiny_tok import tiny_tokenizer

VOCAB = 300
EOS = 1
MODULES = ("stdlib/textwrap", "stdlib/shlex", "stdlib/bisect", "stdlib/glob", "stdlib/fnmatch",
           "stdlib/colorsys", "stdlib/json", "stdlib/json/decoder", "stdlib/heapq", "stdlib/keyword",
           "stdlib/base64", "stdlib/filecmp", "stdlib/getpass", "stdlib/chunk")  # the last four held out


def tiny_target(seed: int = 0, eos: int = EOS) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8, initializer_range=0.5,
                      max_position_embeddings=2048, tie_word_embeddings=True, pad_token_id=None,
                      bos_token_id=None, eos_token_id=eos)
    return LlamaForCausalLM(cfg).eval()


@pytest.fixture
def small_stdlib(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(I, "STDLIB_ONLY", frozenset(MODULES))
    I.build_examples.cache_clear()
    yield
    I.build_examples.cache_clear()


PROMPTS = [[5, 6, 7, 8, 9, 10, 11, 12, 13], [40, 41], [20, 21, 22, 23, 24], [70, 71, 72, 73]]


# ------------------------------------------------------------------------------ generation
@pytest.mark.parametrize("compact", [True, False])
def test_batched_left_padded_answers_equal_hf_generate_and_full_forward_labels(compact: bool) -> None:
    """Every row of one padded batch is what HF greedy generation gives that prompt alone, its
    labels are the top-k of a plain full forward over the row's own tokens, padding is never
    valid, and an EOS ends a row (its column has no label). Wrong positions or a mask that let
    padding in would change the tokens and the logits."""
    target = tiny_target()
    ref = [target.generate(torch.tensor([p]), do_sample=False, max_new_tokens=10, pad_token_id=0,
                           eos_token_id=[])[0].tolist() for p in PROMPTS]
    eos = ref[1][len(PROMPTS[1]) + 3]  # row 1 ends after 4 generated tokens, the others go on
    out = I.generate_batch(target, PROMPTS, new_tokens=10, top_k=4, eos=[eos], pad_id=0, compact=compact)
    width = max(map(len, PROMPTS))
    assert out["tokens"].shape == (4, width + 10)
    for i, p in enumerate(PROMPTS):
        start = width - len(p)
        assert int(out["start"][i]) == start and not out["valid"][i, :start].any()
        row = out["tokens"][i, start:]
        expect, labelled = ref[i], len(p) + 10
        if eos in expect[len(p):]:
            cut = expect.index(eos, len(p))
            expect, labelled = expect[:cut + 1], cut  # the EOS column itself has no label
            assert not out["valid"][i, start + cut:].any() and out["valid"][i, start + cut - 1]
        assert row[:len(expect)].tolist() == expect
        valid = out["valid"][i, start:]
        with torch.no_grad():
            logits = target(input_ids=row[None, :len(expect)]).logits[0]
        top = logits.topk(4, dim=-1)
        n = int(valid.sum())
        assert valid[:n].all() and n == labelled
        assert torch.equal(out["topk_ids"][i, start:start + n, 0], top.indices[:n, 0])
        torch.testing.assert_close(out["topk_logits"][i, start:start + n].float(), top.values[:n], atol=2e-2, rtol=2e-3)
    assert any(eos in r[len(p):] for r, p in zip(ref, PROMPTS))


def test_sampled_rows_are_seeded_and_leave_greedy_rows_alone() -> None:
    target = tiny_target()
    greedy = I.generate_batch(target, PROMPTS, new_tokens=8, top_k=2, eos=[], pad_id=0)
    temps = [0.0, 1.5, 0.0, 1.5]
    a = I.generate_batch(target, PROMPTS, new_tokens=8, top_k=2, eos=[], pad_id=0, temperatures=temps, seed=7)
    b = I.generate_batch(target, PROMPTS, new_tokens=8, top_k=2, eos=[], pad_id=0, temperatures=temps, seed=7)
    c = I.generate_batch(target, PROMPTS, new_tokens=8, top_k=2, eos=[], pad_id=0, temperatures=temps, seed=8)
    assert torch.equal(a["tokens"], b["tokens"])
    assert torch.equal(a["tokens"][[0, 2]], greedy["tokens"][[0, 2]])
    assert not torch.equal(a["tokens"][[1, 3]], c["tokens"][[1, 3]])


def test_padded_training_windows_see_no_padding() -> None:
    """The draft's logits on a left-padded window under :func:`pad_attention` equal its logits on
    the unpadded tokens; without the mask they do not (the test can fail)."""
    target = tiny_target()
    cfg = R.DraftConfig.from_target(target, name="t", layers=2, vocab_subset=list(range(VOCAB)))
    draft = R.DistilledDraft(cfg, target.get_input_embeddings()).eval()
    ids = torch.randint(2, VOCAB, (1, 9))
    padded = torch.cat([torch.zeros(1, 5, dtype=torch.long), ids], dim=1)
    real = torch.arange(14)[None] >= 5
    with torch.no_grad():
        alone = draft.subset_logits(ids)
        masked = draft.subset_logits(padded, attention_mask=D.pad_attention(real, torch.float32))
        unmasked = draft.subset_logits(padded)
    torch.testing.assert_close(masked[:, 5:], alone, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(unmasked[:, 5:], alone, atol=1e-3)
    assert D.pad_attention(torch.ones(2, 4, dtype=torch.bool), torch.float32) is None


# ----------------------------------------------------------------------------------- split
def test_every_request_is_on_one_side_and_sides_share_no_template_or_document(small_stdlib) -> None:
    cfg = DistillConfig(data="instruct")
    train, held = I.examples(cfg, held_out=False), I.examples(cfg, held_out=True)
    for kind in I.KIND_WEIGHTS:
        assert train[kind] and held[kind], kind
    flat_t = [e for v in train.values() for e in v]
    flat_h = [e for v in held.values() for e in v]
    templates = lambda es: {p for e in es for p in e.template.split("+")}  # noqa: E731
    assert not templates(flat_t) & templates(flat_h)
    assert not {e.source for e in flat_t} - {None} & {e.source for e in flat_h}
    for e in flat_t:
        assert all(not I.template_held_out(p) for p in e.template.split("+"))
        assert e.source is None or not (corpora.is_held_out(I._split_key(e.source))
                                        or corpora.is_held_out(I._split_key(e.source), cfg.holdout_every))
        assert e.messages[-1][0] == "user"
    for e in flat_h:
        assert all(I.template_held_out(p) for p in e.template.split("+"))
        assert e.source is None or corpora.is_held_out(I._split_key(e.source), cfg.holdout_every)
    assert all(t.name.startswith("distill/") for t in IT.ALL) and all(t.name.startswith("distill/") for t in IT.MATH)
    # a package's modules go with the package, so a held-out package never trains through a submodule
    assert I._split_key("stdlib/json/decoder") == I._split_key("stdlib/json") == "stdlib/json"


def test_each_template_kind_has_both_sides() -> None:
    groups = {**IT.PASSAGE_TEMPLATES, "code": IT.CODE, "chat": IT.CHAT, "topic": IT.TOPIC,
              "follow-up": IT.FOLLOW_UPS, "math": IT.MATH}
    for kind, templates in groups.items():
        sides = {I.template_held_out(t.name) for t in templates}
        assert sides == {True, False}, kind


def test_a_non_default_holdout_never_moves_a_bench_document_into_training(small_stdlib) -> None:
    cfg = DistillConfig(data="instruct", holdout_every=5)
    train = [e for v in I.examples(cfg, held_out=False).values() for e in v]
    assert train
    assert not any(e.source and corpora.is_held_out(I._split_key(e.source)) for e in train)


def _canon(text: str) -> str:
    return re.sub(r"[^0-9a-z]", "", text.lower())


def _bench_held_out():
    from dynatree.bench import instruct as B

    return [e for c in B.CATEGORIES for e in B.instruct_examples(c, held_out=True)]


def test_no_held_out_prompt_of_the_bench_reaches_instruct_training() -> None:
    """Both sets in full: the bench's held-out instruct prompts (all six categories) and every
    training request of the instruct data share no source document, no template and no text (no
    paragraph of 100+ characters of a held-out bench prompt, compared on letters and digits, occurs
    in any training request; the raw corpus does repeat held-out paragraphs across documents, so
    this is what the content guard buys)."""
    bench = _bench_held_out()
    cfg = DistillConfig(data="instruct")
    I.build_examples.cache_clear()
    train = [e for v in I.examples(cfg, held_out=False).values() for e in v]
    assert len(train) > 10_000 and len(bench) > 300
    assert not {e.source for e in bench} - {None} & {e.source for e in train}
    assert not {e.template for e in bench} & {p for e in train for p in e.template.split("+")}
    # by content: no 60-character run (letters and digits) of any paragraph of 100+ characters of a
    # held-out bench prompt occurs in any training request
    guard = HeldOutText(chunk for e in bench for _, content in e.messages for chunk in content.split("\n\n")
                        if len(chunk) >= 100)
    contents = {content for e in train for _, content in e.messages}
    shared = [c[:120] for c in contents if guard.shares(c)]
    assert not shared, shared[:3]


def test_continuation_training_text_shares_nothing_with_held_out_documents() -> None:
    """The pydoc leak: split by topic name alone, training topics repeated held-out paragraphs
    (``assignment`` holds ``augassign``'s, ``compound`` holds ``async``'s). The raw documents do
    share text (so the check can fail); the training pieces do not."""
    docs = DD.offline_corpus()
    held = HeldOutText(d.text for d in docs if corpora.is_held_out(d.name))
    raw_shared = {d.name for d in docs if not corpora.is_held_out(d.name)
                  and any(held.shares(p) for p in d.text.split("\n\n"))}
    assert {"pydoc/assignment", "pydoc/compound"} <= raw_shared
    pairs = DD.training_documents(docs, corpora.HOLDOUT_EVERY)
    training = [d for d, h in pairs if not h]
    assert training and not any(held.shares(p) for d in training for p in d.text.split("\n\n"))
    assert {d.name for d, h in pairs if h} == {d.name for d in docs if corpora.is_held_out(d.name)}
    assert SHINGLE == 60


# ------------------------------------------------------------------------------- end to end
SMALL = dict(layers=1, vocab_subset=64, batch=4, seq_len=64, top_k=4, steps=4, warmup=1, lr=3e-3,
             eval_every=2, checkpoint_every=2, max_prompt_tokens=700, answer_tokens=8, train_sequences=24,
             eval_sequences=8, gen_batch=8, followup_fraction=0.25)


def test_instruct_distill_end_to_end_data_reused_and_resumable(small_stdlib, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    tok = tiny_tokenizer()
    target = tiny_target(eos=tok.eos_token_id)
    cfg = DistillConfig(data="instruct", **SMALL)
    lines: list[str] = []
    train, evals = L.labelled_sets(target, tok, tmp_path, cfg, progress=False, log=lines.append)
    assert len(train) == 24 and len(evals) == 8 and "positions" in lines[0]
    kinds = {I.KINDS[k] for k in train.kind.tolist()}
    assert "follow-up" in kinds and len(kinds) >= 6
    for data in (train, evals):
        cols = torch.arange(data.tokens.shape[1])
        assert not (data.valid & (cols[None] < data.start[:, None])).any()  # padding is never a label
        gen = data.generated_mask()
        assert gen.any() and not (gen & (cols[None] < data.gen_start[:, None])).any()
    follow = train.kind == I.KINDS.index("follow-up")
    text = tok.decode(train.tokens[follow][0][int(train.start[follow][0]):])
    assert text.count("<|im_start|>assistant") == 2  # the target's own first answer, then a follow-up
    assert not list(tmp_path.glob("*.partial.pt")) and (tmp_path / DD.DATA_FILE).is_file()

    def no_labelling(*args: object, **kwargs: object) -> None:
        raise AssertionError("labelled data must come from data.pt")

    monkeypatch.setattr(I, "generate_batch", no_labelling)
    final = D.distill(target, tok, out_dir=tmp_path, config=cfg, target_name="tiny", progress=False)
    metrics = json.loads((final / "metrics.json").read_text())
    assert set(metrics["eval"]["by_kind"]) <= set(I.KINDS) and metrics["eval"]["positions"] > 0
    log = [json.loads(line) for line in (tmp_path / D.LOG_FILE).read_text().splitlines()]
    assert [r["step"] for r in log] == [1, 2, 3, 4] and all(r["loss"] == r["loss"] for r in log)
    # other data settings relabel (the key decides)
    with pytest.raises(AssertionError, match="data.pt"):
        L.labelled_sets(target, tok, tmp_path, dataclasses.replace(cfg, answer_tokens=6), progress=False)


def test_feature_head_on_instruct_data_reads_fused_layers_end_to_end(small_stdlib, tmp_path: Path) -> None:
    """``--kind feature --feature-layers auto`` on left-padded instruct data: features per layer
    are cached, the loss goes down, the held-out score is by kind, and the loaded draft is exact."""
    from dynatree import generate
    from dynatree.drafts.checkpoint import load_distilled_draft
    from dynatree.drafts.feature_head import FeatureDraft
    from dynatree.options import StoppingConfig
    from dynatree.training import features as F

    tok = tiny_tokenizer()
    target = tiny_target(eos=tok.eos_token_id)
    cfg = DistillConfig(data="instruct", kind="feature", feature_layers="auto", unroll=2,
                        **{**SMALL, "steps": 6, "followup_fraction": 0.0})
    final = F.distill_features(target, tok, out_dir=tmp_path, config=cfg, target_name="tiny", progress=False)
    saved = torch.load(tmp_path / F.FEATURES_FILE, weights_only=True)
    assert saved["train"].shape[-1] == 2 * 32  # layers (1, 2) of the 3-layer target, concatenated
    log = [json.loads(line) for line in (tmp_path / D.LOG_FILE).read_text().splitlines()]
    assert [r["step"] for r in log] == list(range(1, 7)) and log[-1]["loss"] < log[0]["loss"]
    metrics = json.loads((final / "metrics.json").read_text())
    assert set(metrics["eval"]["by_kind"]) <= set(I.KINDS) and metrics["eval"]["positions"] > 0
    draft = load_distilled_draft(target, final)
    assert isinstance(draft, FeatureDraft) and draft.feature_layers == (1, 2)
    prompt = torch.tensor([[5, 6, 7, 8, 9, 10, 11]])
    stop = StoppingConfig(eos_token_id=())
    ref = generate(target, None, prompt, "autoregressive", max_new_tokens=12, stopping=stop).sequences
    assert torch.equal(generate(target, draft, prompt, "dynatree", max_new_tokens=12, stopping=stop, text=False).sequences, ref)


def test_interrupted_labelling_resumes_from_its_partial_file(small_stdlib, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    tok = tiny_tokenizer()
    target = tiny_target(eos=tok.eos_token_id)
    cfg = DistillConfig(data="instruct", **{**SMALL, "gen_batch": 4, "followup_fraction": 0.0})
    straight = L.labelled_sets(target, tok, tmp_path / "a", cfg, progress=False, log=lambda _: None)
    real = I.generate_batch
    calls = {"n": 0}

    def crash_on_fourth(*args: object, **kwargs: object) -> dict:
        calls["n"] += 1
        if calls["n"] == 4:  # held-out: 2 batches done; training: 1 done, then the crash
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(I, "generate_batch", crash_on_fourth)
    monkeypatch.setattr(I, "SAVE_EVERY_S", 0.0)
    (tmp_path / "b").mkdir()
    with pytest.raises(KeyboardInterrupt):
        L.labelled_sets(target, tok, tmp_path / "b", cfg, progress=False, log=lambda _: None)
    assert len(list((tmp_path / "b").glob("*.partial.pt"))) == 2
    calls["n"] = -1000
    resumed = L.labelled_sets(target, tok, tmp_path / "b", cfg, progress=False, log=lambda _: None)
    assert calls["n"] == -1000 + len(straight[0]) // 4 - 1  # the finished batches are not redone
    for a, b in zip(straight, resumed):
        for f in ("tokens", "topk_ids", "valid", "start", "kind"):
            assert torch.equal(getattr(a, f), getattr(b, f)), f


def test_mix_pads_continuation_rows_and_keeps_their_generated_columns(small_stdlib, tmp_path: Path) -> None:
    tok = tiny_tokenizer()
    target = tiny_target(eos=tok.eos_token_id)
    rng = random.Random(0)
    docs = [DD.Text(f"doc{i}", " ".join(rng.choice(("the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog"))
                                        + str(rng.randrange(100)) for _ in range(60))) for i in range(12)]
    cfg = DistillConfig(data="mix", instruct_fraction=0.5, prompt_tokens=24, new_tokens=6, holdout_every=3,
                        **{**SMALL, "followup_fraction": 0.0})
    train, evals = L.labelled_sets(target, tok, tmp_path, cfg, documents=docs, progress=False, log=lambda _: None)
    cont = train.kind == 0
    assert int(cont.sum()) == 12 and int((~cont).sum()) == 12
    length = train.tokens.shape[1]
    assert (train.start[cont] == length - 30).all() and (train.gen_start[cont] == length - 30 + 23).all()
    assert (train.valid[cont][:, : length - 30] == 0).all()


def test_config_validation_and_data_key() -> None:
    with pytest.raises(DynaTreeError, match="data must be"):
        DistillConfig(data="chat")
    DistillConfig(data="instruct", kind="feature", feature_layers="auto")  # fused layers on instruct data
    for bad, match in ((dict(feature_layers="auto"), "feature drafts"),
                       (dict(kind="feature", feature_layers="2,x"), "layer numbers"),
                       (dict(kind="feature", feature_layers="auto", feature_weight=1.0), "feature_weight")):
        with pytest.raises(DynaTreeError, match=match):
            DistillConfig(**bad)
    assert DistillConfig(kind="feature", feature_layers="final").regression_weight() == 1.0
    assert DistillConfig(kind="feature").feature_layers == "auto"  # the default for feature drafts
    assert DistillConfig(kind="feature").regression_weight() == 0.0
    assert DistillConfig().feature_layers == ""  # independent drafts read no features
    assert DistillConfig(kind="feature", feature_layers="auto").regression_weight() == 0.0
    with pytest.raises(DynaTreeError, match="seq_len"):
        DistillConfig(data="instruct", seq_len=600, max_prompt_tokens=400, answer_tokens=100)
    DistillConfig(data="instruct", seq_len=500, max_prompt_tokens=400, answer_tokens=100)
    with pytest.raises(DynaTreeError, match="sample_fraction"):
        DistillConfig(data="instruct", sample_fraction=1.5)
    cont, inst = DistillConfig(), DistillConfig(data="instruct")
    assert cont.corpus_names() == ["pydoc", "licences", "wiki", "books"]
    assert inst.corpus_names() == ["pydoc", "licences"]
    assert cont.data_key() != inst.data_key() and "answer_tokens" not in cont.data_key()
    assert inst.data_key() != DistillConfig(data="instruct", sample_fraction=0.5).data_key()
    assert inst.data_key() == DistillConfig(data="instruct", steps=9, gen_batch=64).data_key()


def test_cli_builds_the_instruct_config(monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from dynatree.cli.main import app
    from dynatree.training import run

    seen = {}

    def fake(target: str, cfg: DistillConfig, **kwargs: object):
        seen["cfg"] = cfg
        return Path("x"), {"generated": 0.5, "linear_k4_tokens": 1.5}

    monkeypatch.setattr(run, "distill_with_target", fake)
    result = CliRunner().invoke(app, ["distill", "--data", "instruct", "--seq-len", "384", "--answer-tokens", "96",
                                      "--gen-batch", "64", "--sample-fraction", "0.5", "--out", "unused"])
    assert result.exit_code == 0, result.output
    cfg = seen["cfg"]
    assert (cfg.data, cfg.seq_len, cfg.answer_tokens, cfg.gen_batch, cfg.sample_fraction) == ("instruct", 384, 96, 64, 0.5)
    bad = CliRunner().invoke(app, ["distill", "--data", "nope", "--out", "unused"])
    assert bad.exit_code == 2 and "data must be" in bad.output
