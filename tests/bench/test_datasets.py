"""Prompt sets: cleaning, token caps, determinism, local files and the offline failure modes.

The tokenizer is a small byte-level BPE trained in-process on the pydoc text (no hub), wrapped as
a transformers fast tokenizer; a second one adds a BOS token to check that caps count it.
"""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from dynatree.bench import datasets as prompt_sets
from dynatree.text.corpora import LICENCES_DIR
from dynatree.text.prose import pydoc_runs
from dynatree.bench.datasets import cut_to_tokens, load_prompt_ids, load_prompts
from dynatree.errors import DynaTreeError


def _train_tokenizer(add_bos: bool) -> PreTrainedTokenizerFast:
    from pydoc_data.topics import topics

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<s>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    backend.train_from_iterator(list(topics.values())[:20], trainer)
    if add_bos:
        backend.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>")


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerFast:
    return _train_tokenizer(add_bos=False)


@pytest.fixture(scope="module")
def bos_tokenizer() -> PreTrainedTokenizerFast:
    return _train_tokenizer(add_bos=True)


def n_tokens(tokenizer: PreTrainedTokenizerFast, text: str) -> int:
    return len(tokenizer(text)["input_ids"])


# ----------------------------------------------------------------------------------- pydoc


def test_pydoc_prompts_are_clean_prose_within_the_cap(tokenizer: PreTrainedTokenizerFast) -> None:
    prompts = load_prompts("pydoc", tokenizer, num_prompts=30, max_prompt_tokens=48, seed=0)
    paragraphs = [p for doc in prompt_sets.pydoc_documents() for run in doc for p in run]
    assert len(prompts) == 30 and len(set(prompts)) == 30
    for prompt in prompts:
        assert prompt.strip() == prompt and prompt
        assert 0 < n_tokens(tokenizer, prompt) <= 48
        assert "::=" not in prompt and ">>>" not in prompt and "***" not in prompt
        assert any(p.startswith(prompt[:30]) for p in paragraphs)  # starts at a paragraph start
    # Most paragraphs exceed 48 tokens here, so most prompts are cut right at the cap.
    assert sum(n_tokens(tokenizer, p) >= 46 for p in prompts) >= 20


def test_prompt_sets_are_deterministic_per_seed(tokenizer: PreTrainedTokenizerFast) -> None:
    first = load_prompts("pydoc", tokenizer, 10, 32, seed=1)
    assert first == load_prompts("pydoc", tokenizer, 10, 32, seed=1)
    assert first != load_prompts("pydoc", tokenizer, 10, 32, seed=2)


def test_long_prompts_continue_into_the_next_paragraphs(tokenizer: PreTrainedTokenizerFast) -> None:
    prompts = load_prompts("pydoc", tokenizer, 10, 400, seed=0)
    assert all(n_tokens(tokenizer, p) <= 400 for p in prompts)
    assert any("\n\n" in p for p in prompts)


def test_caps_count_special_tokens(bos_tokenizer: PreTrainedTokenizerFast) -> None:
    ids = load_prompt_ids("pydoc", bos_tokenizer, 5, 20, seed=0)
    assert all(row[0] == bos_tokenizer.bos_token_id and len(row) <= 20 for row in ids)
    assert max(len(row) for row in ids) == 20


def test_cut_to_tokens_keeps_the_exact_text_prefix(tokenizer: PreTrainedTokenizerFast) -> None:
    text = "The  quick brown fox jumps over the lazy dog, again and again and again."
    cut = cut_to_tokens(text, tokenizer, 5)
    assert text.startswith(cut) and cut != text and n_tokens(tokenizer, cut) <= 5
    assert cut_to_tokens(text, tokenizer, 1000) == text


def test_pydoc_cleaning_keeps_only_prose() -> None:
    prose = " ".join(["This paragraph is prose and long enough to be kept by the cleaner."] * 2)
    topic = "\n\n".join([
        "The \"if\" statement\n******************",
        "The \"if\" statement is used for conditional execution:",
        "   if_stmt ::= \"if\" assignment_expression \":\" suite",
        prose,
        prose.replace("kept", "joined\nacross lines"),
        "   x = 1\n   print(x)",
        "See also **PEP 614** which is prose as well and it has quite enough words to stay in a run [5].",
        "x = {a: b for a, b in c} if d[e] else f | g & h ^ i if j == k else l[m] and n.",
    ])
    runs = pydoc_runs(topic)
    assert runs == [
        [prose, prose.replace("kept", "joined across lines")],
        ["See also PEP 614 which is prose as well and it has quite enough words to stay in a run."],
    ]


# -------------------------------------------------------------------------------- licences


def test_license_documents_dedupe_links_and_skip_headings(tmp_path: Path) -> None:
    body = "  Everyone is permitted to copy and distribute verbatim copies of this license\ndocument, " \
        "but changing it is not allowed, and that is the whole point of it."
    (tmp_path / "GPL-3").write_text(f"            GNU GENERAL PUBLIC LICENSE\n\n{body}\n")
    (tmp_path / "GPL").symlink_to(tmp_path / "GPL-3")
    documents = prompt_sets.license_documents(tmp_path)
    assert documents == [[[" ".join(body.split())]]]


def test_missing_licenses_dir_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(DynaTreeError, match="--dataset pydoc"):
        prompt_sets.license_documents(tmp_path / "absent")


@pytest.mark.skipif(not LICENCES_DIR.is_dir(), reason="no /usr/share/common-licenses here")
def test_license_prompts(tokenizer: PreTrainedTokenizerFast) -> None:
    prompts = load_prompts("licenses", tokenizer, 12, 64, seed=0)
    assert len(set(prompts)) == 12 and all(0 < n_tokens(tokenizer, p) <= 64 for p in prompts)


# ---------------------------------------------------------------------------- local files


def test_txt_file_gives_one_prompt_per_paragraph_in_order(tmp_path: Path, tokenizer) -> None:
    path = tmp_path / "prompts.txt"
    long = "word " * 200
    path.write_text(f"First prompt.\n\n\nSecond prompt\nwith two lines.\n  \n{long}\n")
    prompts = load_prompts(str(path), tokenizer, 3, 32)
    assert prompts[:2] == ["First prompt.", "Second prompt\nwith two lines."]
    assert long.startswith(prompts[2]) and n_tokens(tokenizer, prompts[2]) == 32
    assert load_prompts(str(path), tokenizer, 1, 32) == ["First prompt."]


def test_jsonl_file_reads_text_or_prompt(tmp_path: Path, tokenizer) -> None:
    path = tmp_path / "prompts.jsonl"
    path.write_text(json.dumps({"text": "from text"}) + "\n\n" + json.dumps({"prompt": "from prompt", "id": 3}) + "\n")
    assert load_prompts(str(path), tokenizer, 2, 16) == ["from text", "from prompt"]


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("empty.txt", "\n \n", "contains no prompts"),
        ("empty.jsonl", "", "contains no prompts"),
        ("bad.jsonl", '{"text": "ok"}\n{"text": oops}\n', r"bad\.jsonl:2: not valid JSON"),
        ("nofield.jsonl", '{"body": "x"}\n', r"nofield\.jsonl:1: expected an object"),
        ("prompts.csv", "a,b\n", "must be .txt"),
        ("few.txt", "only one prompt", "has only 1 prompts, 2 requested"),
    ],
)
def test_bad_local_files_are_one_line_errors(tmp_path: Path, tokenizer, name: str, content: str, message: str) -> None:
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(DynaTreeError, match=message) as info:
        load_prompts(str(path), tokenizer, 2, 16)
    assert "\n" not in str(info.value)


def test_unknown_set_names_the_choices(tokenizer) -> None:
    with pytest.raises(DynaTreeError, match="pydoc, licenses, wikitext2, pg19"):
        load_prompts("wikitext3", tokenizer, 1, 16)


# ---------------------------------------------------------------------------- hub sets


def test_hub_sets_without_datasets_package(monkeypatch: pytest.MonkeyPatch, tokenizer) -> None:
    monkeypatch.setitem(sys.modules, "datasets", None)  # makes `import datasets` fail
    with pytest.raises(DynaTreeError, match="pip install datasets.*--dataset pydoc"):
        load_prompts("wikitext2", tokenizer, 1, 16)


def test_hub_sets_when_the_hub_is_unreachable(monkeypatch: pytest.MonkeyPatch, tokenizer) -> None:
    def unreachable(*args: object, **kwargs: object) -> None:
        raise ConnectionError("Couldn't reach 'emozilla/pg19-test' on the Hub (LocalEntryNotFoundError)\nmore")

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=unreachable))
    with pytest.raises(DynaTreeError, match="cannot load emozilla/pg19-test.*--dataset pydoc") as info:
        load_prompts("pg19", tokenizer, 1, 16)
    assert "\n" not in str(info.value)


def test_wikitext2_parsing(monkeypatch: pytest.MonkeyPatch, tokenizer) -> None:
    sentence = "The ship , built in 1 @,@ 900 , was 12 @.@ 5 m long and well @-@ known for years ( before the war ) ."
    later = "After the war the ship 's crew sailed her to the south , where she served as a training ship for years ."
    rows = [" \n", " = Ship = \n", " \n", f" {sentence} {sentence} \n", " \n", " = = History = = \n",
            f" {later} {later} \n", " = Other = \n", " Too short . \n"]
    calls: list[tuple] = []

    def load_dataset(*args: str, split: str) -> dict[str, list[str]]:
        calls.append((*args, split))
        return {"text": rows}

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    clean = "The ship, built in 1,900, was 12.5 m long and well-known for years (before the war)."
    clean_later = (
        "After the war the ship's crew sailed her to the south, where she served as a training ship for years."
    )
    # The section heading splits the article into two runs; the prose-less article is dropped.
    expected = [[[f"{clean} {clean}"], [f"{clean_later} {clean_later}"]]]
    assert prompt_sets.wikitext2_documents() == expected
    assert calls == [("Salesforce/wikitext", "wikitext-2-raw-v1", "test")]
    assert load_prompts("wikitext2", tokenizer, 2, 800) == [f"{clean} {clean}", f"{clean_later} {clean_later}"]
