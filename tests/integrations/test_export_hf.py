"""Exporting a distilled draft as a plain HF causal LM, on a tiny random Llama target (CPU, offline).

What must hold for other tools to use the export: it loads with ``AutoModelForCausalLM``, its
next-token distribution over the *full* vocabulary is the runtime draft's (tokens outside the
subset can never win and get probability 0), and it works as HF's ``assistant_model`` and as
dynatree's own draft. Deliberately broken exports show the comparison would catch a mistake.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM
from typer.testing import CliRunner

import dynatree
from dynatree.integrations import export_hf as X
from dynatree.drafts.distilled import DistilledDraft, DraftConfig, save_draft
from dynatree.errors import DynaTreeError
from dynatree.drafts.feature_head import FeatureDraft
from tiny import SMALL_TREES, hf_greedy
from tiny_tok import VOCAB, tiny_tokenizer

SUBSET = list(range(2, VOCAB, 3))
#: The float32 export differs from the runtime draft by float rounding only: HF's RMSNorm computes
#: in float32 whatever the model dtype, and these random models' large weights amplify its
#: rounding to at most ~4e-5 on logits of size ~10 (measured). A real mistake (a wrong row, an
#: unscaled norm, a missing mask) moves log-probabilities by 0.6 and more (measured).
ATOL = RTOL = 1e-4


def tiny_target(seed: int = 0, heads: int = 4) -> LlamaForCausalLM:
    """A random Llama target over the tiny tokenizer's vocabulary, peaked enough that drafts agree."""
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=8 * heads, intermediate_size=64, num_hidden_layers=3,
                      num_attention_heads=heads, num_key_value_heads=1, head_dim=8, initializer_range=0.3,
                      max_position_embeddings=256, tie_word_embeddings=True, pad_token_id=0,
                      bos_token_id=None, eos_token_id=None)
    return LlamaForCausalLM(cfg).eval()


def tiny_draft(target: LlamaForCausalLM, layers: int = 2) -> DistilledDraft:
    """The target's early exit over ``SUBSET``, with a perturbed head (a trained draft is not an
    exact early exit, and this makes every exported head row differ from the embedding's)."""
    cfg = DraftConfig.from_target(target, name="tiny", layers=layers, vocab_subset=SUBSET)
    draft = DistilledDraft(cfg, target.get_input_embeddings())
    draft.init_from_target(target)
    torch.manual_seed(1)
    with torch.no_grad():
        draft.head.weight.add_(torch.randn_like(draft.head.weight) * 0.05)
    return draft.eval()


def random_ids(seed: int, batch: int = 3, length: int = 17) -> torch.Tensor:
    return torch.randint(VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


def assert_same_distribution(want: torch.Tensor, got: torch.Tensor) -> None:
    """``got`` (exported) drafts exactly like ``want`` (runtime) over the full vocabulary: equal
    subset logits and argmax, outside tokens finite, never chosen, probability 0 in both."""
    outside = torch.ones(VOCAB, dtype=torch.bool)
    outside[SUBSET] = False
    torch.testing.assert_close(got[..., SUBSET], want[..., SUBSET], rtol=RTOL, atol=ATOL)
    assert torch.equal(got.argmax(-1), want.argmax(-1))
    assert torch.isfinite(got).all()
    assert (got[..., outside] < -1e20).all()
    p_want, p_got = want.softmax(-1), got.softmax(-1)
    assert (p_got[..., outside] == 0).all() and (p_want[..., outside] == 0).all()
    torch.testing.assert_close(got.log_softmax(-1)[..., SUBSET], want.log_softmax(-1)[..., SUBSET],
                               rtol=RTOL, atol=ATOL)


def logits(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids).logits


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[LlamaForCausalLM, DistilledDraft, Path]:
    target = tiny_target()
    draft = tiny_draft(target)
    out = X.export_hf(draft, tmp_path_factory.mktemp("export"), tiny_tokenizer())
    return target, draft, out


def load(folder: Path) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(folder).eval()


def test_the_export_is_a_plain_hf_model_with_its_own_files(pair) -> None:
    target, _, out = pair
    for name in ("config.json", "model.safetensors", "generation_config.json", "tokenizer.json"):
        assert (out / name).is_file(), name
    model = load(out)
    assert type(model) is LlamaForCausalLM
    assert model.config.vocab_size == VOCAB and model.get_output_embeddings().weight.shape[0] == VOCAB
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        assert "model.embed_tokens.weight" in f.keys()  # its own copy, not the target's by reference
    assert model.get_input_embeddings().weight.data_ptr() != target.get_input_embeddings().weight.data_ptr()
    assert len(AutoTokenizer.from_pretrained(out)) == len(tiny_tokenizer())


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_exported_logits_equal_the_runtime_drafts_over_the_full_vocabulary(pair, seed: int) -> None:
    _, draft, out = pair
    ids = random_ids(seed)
    assert_same_distribution(logits(draft, ids), logits(load(out), ids))


def test_the_saved_check_passes_and_reports_what_it_compared(pair) -> None:
    _, draft, out = pair
    result = X.check_export(draft, load(out), sequences=2, length=8)
    assert result.positions == 16 and result.max_logprob_diff <= ATOL


def _forget_mask(model: LlamaForCausalLM, h: int) -> None:
    model.lm_head.weight[:, h] = 0.0  # outside tokens get logit 0 instead of a hugely negative one


def _unscaled_norms(model: LlamaForCausalLM, h: int) -> None:
    for name, p in model.named_parameters():
        if name.endswith("norm.weight"):
            p[:h] /= (h / model.config.hidden_size) ** 0.5


def _head_rows_shifted(model: LlamaForCausalLM, h: int) -> None:
    sub = torch.tensor(SUBSET)
    model.lm_head.weight[sub] = model.lm_head.weight[sub].roll(1, dims=0)


@pytest.mark.parametrize("breakage", [_forget_mask, _unscaled_norms, _head_rows_shifted])
def test_a_broken_export_is_caught(pair, breakage: Callable[[LlamaForCausalLM, int], None]) -> None:
    _, draft, _ = pair
    broken = X.build_hf_model(draft)
    with torch.no_grad():
        breakage(broken, draft.draft_config.hidden_size)
    with pytest.raises(DynaTreeError, match="differs from the draft|different next token"):
        X.check_export(draft, broken)
    ids = random_ids(0)
    with pytest.raises(AssertionError):
        assert_same_distribution(logits(draft, ids), logits(broken, ids))


def test_hf_assisted_generation_with_the_export_equals_hf_greedy(pair) -> None:
    target, _, out = pair
    assistant = load(out)
    calls: list[int] = []
    assistant.register_forward_hook(lambda *_: calls.append(1))
    ids = random_ids(3, batch=1, length=6)
    want = hf_greedy(target, ids, 40)
    got = target.generate(ids, assistant_model=assistant, do_sample=False, max_new_tokens=40, pad_token_id=0)
    assert calls, "HF did not call the assistant"
    assert torch.equal(got, want)


def test_dynatree_with_the_exported_draft_equals_hf_greedy(pair) -> None:
    target, _, out = pair
    ids = random_ids(4, batch=1, length=6)
    result = dynatree.generate(target, load(out), ids, "dynatree", max_new_tokens=40,
                               stopping=dynatree.StoppingConfig(eos_token_id=()), **SMALL_TREES["dynatree"], text=False)
    assert torch.equal(result.sequences, hf_greedy(target, ids, 40))
    assert result.stats.mean_committed > 1  # the export really drafted: tokens were accepted


@pytest.mark.parametrize("heads", [3, 9])
def test_a_head_count_that_is_not_a_power_of_two_exports_and_loads(tmp_path: Path, heads: int) -> None:
    """HF refuses to save a hidden size that is not a multiple of the head count (SmolLM2 has 9):
    the padded width must respect it, and the export still equals the runtime draft."""
    target = tiny_target(heads=heads)
    draft = tiny_draft(target)
    model = load(X.export_hf(draft, tmp_path))
    width = model.config.hidden_size
    assert width > 8 * heads and width % heads == 0 and width % 8 == 0
    ids = random_ids(7)
    assert_same_distribution(logits(draft, ids), logits(model, ids))


def test_bfloat16_export_still_masks_the_outside_tokens(tmp_path: Path) -> None:
    target = tiny_target()
    draft = tiny_draft(target)
    out = X.export_hf(draft, tmp_path, dtype=torch.bfloat16)
    model = load(out)
    assert model.dtype == torch.bfloat16
    got = logits(model, random_ids(5)).float()
    outside = torch.ones(VOCAB, dtype=torch.bool)
    outside[SUBSET] = False
    assert torch.isfinite(got).all() and (got[..., outside] < -1e20).all()
    assert (got.softmax(-1)[..., outside] == 0).all()


def test_float16_export_is_refused(tmp_path: Path) -> None:
    draft = tiny_draft(tiny_target())
    with pytest.raises(DynaTreeError, match="float16"):
        X.export_hf(draft, tmp_path, dtype=torch.float16)
    assert not any(tmp_path.iterdir())


def test_the_feature_draft_and_non_drafts_are_refused(tmp_path: Path) -> None:
    target = tiny_target()
    cfg = DraftConfig.from_target(target, name="tiny", layers=1, vocab_subset=SUBSET, kind="feature")
    with pytest.raises(DynaTreeError, match="feature-conditioned"):
        X.export_hf(FeatureDraft(cfg, target.get_input_embeddings()), tmp_path)
    with pytest.raises(DynaTreeError, match="distilled draft"):
        X.export_hf(target, tmp_path)
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_cli_exports_a_distilled_draft_folder(tmp_path: Path, dtype: str) -> None:
    target = tiny_target()
    target.save_pretrained(tmp_path / "target")
    tiny_tokenizer().save_pretrained(tmp_path / "target")
    draft = tiny_draft(target)
    save_draft(draft, tmp_path / "draft", dtype=torch.float32)
    from dynatree.cli import app

    argv = ["export-draft", "--target", str(tmp_path / "target"), "--draft", str(tmp_path / "draft"),
            "--out", str(tmp_path / "out"), "--dtype", dtype]
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 0, result.output
    assert "draft exported to" in result.output and "equals the runtime draft" in result.output
    # the summary must not claim float32 equality for files it rounded
    assert ("rounded to bfloat16" in result.output) == (dtype == "bfloat16")
    model = load(tmp_path / "out")
    assert model.dtype == getattr(torch, dtype)
    if dtype == "float32":
        ids = random_ids(6)
        assert_same_distribution(logits(draft, ids), logits(model, ids))


@pytest.mark.parametrize("argv, message", [
    (["--draft", "no-such-draft"], "neither a shipped draft"),
    (["--dtype", "float16"], "float16"),
])
def test_cli_bad_input_is_one_line(tmp_path: Path, argv: list[str], message: str) -> None:
    from dynatree.cli import app

    result = CliRunner().invoke(app, ["export-draft", "--out", str(tmp_path / "out"), *argv])
    assert result.exit_code == 2 and message in result.output
    assert not (tmp_path / "out").exists()
