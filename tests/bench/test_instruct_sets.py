"""Instruct prompt sets (Spec-Bench's categories): determinism, the held-out split by template and
by source document, sizes, the chat template, the bench's registration and one-line errors.

Prompts are rendered with the tiny ChatML tokenizer of ``tests/tiny_tok.py`` (no hub); the
examples themselves do not depend on a tokenizer.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dynatree.text import corpora, python_source
from dynatree.bench import instruct
from dynatree.bench.datasets import load_prompt_ids, load_prompts
from dynatree.catalog import PROMPT_SETS
from dynatree.errors import DynaTreeError
from tiny_tok import tiny_tokenizer

PASSAGE_CATEGORIES = ("summarize", "qa", "rewrite")
FINGERPRINT = """
import hashlib, json
from dynatree.bench import instruct
blob = {f"{c}/{h}": [e.as_messages() for e in instruct.instruct_examples(c, held_out=h)]
        for c in instruct.CATEGORIES for h in (True, False)}
print(hashlib.sha256(json.dumps(blob, sort_keys=True).encode()).hexdigest())
"""


def _fingerprint() -> str:
    blob = {f"{c}/{h}": [e.as_messages() for e in instruct.instruct_examples(c, held_out=h)]
            for c in instruct.CATEGORIES for h in (True, False)}
    return hashlib.sha256(json.dumps(blob, sort_keys=True).encode()).hexdigest()


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


def test_examples_are_the_same_in_a_fresh_process_with_another_hash_seed() -> None:
    """Nothing depends on Python's salted ``hash`` or on set order: a second interpreter with
    another PYTHONHASHSEED builds the very same conversations, in the same order."""
    src = str(Path(instruct.__file__).parents[2])
    env = {**os.environ, "PYTHONHASHSEED": "12345", "PYTHONPATH": src}
    out = subprocess.run([sys.executable, "-c", FINGERPRINT], env=env, capture_output=True, text=True,
                         timeout=300, check=True)
    assert out.stdout.strip() == _fingerprint()


def test_same_ids_twice_and_seed_only_reorders(tok) -> None:
    first = instruct.instruct_prompts("code", tok)
    instruct._examples.cache_clear()  # rebuild from the sources, not from the cache
    again = instruct.instruct_prompts("code", tok)
    assert first == again
    reordered = instruct.instruct_prompts("code", tok, seed=1)
    assert reordered != first and sorted(reordered) == sorted(first)


@pytest.mark.parametrize("category", instruct.CATEGORIES)
def test_held_out_and_training_share_no_template_and_no_document(category: str) -> None:
    held = instruct.instruct_examples(category, held_out=True)
    train = instruct.instruct_examples(category, held_out=False)
    assert len(held) >= 12 and len(train) >= len(held)
    assert not {e.template for e in held} & {e.template for e in train}
    sources = {e.source for e in held} - {None}
    assert not sources & ({e.source for e in train} - {None})
    # the rule itself, from the corpora's document split and the template hash
    for e in held:
        assert instruct.template_held_out(e.template)
        assert e.source is None or corpora.is_held_out(e.source)
    for e in train:
        assert not instruct.template_held_out(e.template)
        assert e.source is None or not corpora.is_held_out(e.source)
    # and by content, over every category's training side (a draft trains on all of them): no
    # paragraph of a held-out prompt appears in a training prompt, whatever the documents' names
    leaked = [chunk for e in held for _, text in e.messages for chunk in text.split("\n\n")
              if len(chunk) >= 100 and chunk in _training_text()]
    assert not leaked, leaked[:2]


@functools.lru_cache(maxsize=1)
def _training_text() -> str:
    return "\n\0\n".join(text for c in instruct.CATEGORIES for e in instruct.instruct_examples(c, held_out=False)
                          for _, text in e.messages)


@pytest.mark.parametrize("category", instruct.CATEGORIES)
def test_every_category_has_held_out_prompts_that_copy_from_a_given_input(category: str) -> None:
    held = instruct.instruct_examples(category)
    assert len(held) >= 12
    assert len(set(held)) == len(held)  # no prompt twice
    for e in held:
        roles = [role for role, _ in e.messages]
        assert roles[-1] == "user" and roles == ["user", "assistant"] * (len(roles) // 2) + ["user"]
        assert all(text.strip() and "{" + "passage}" not in text for _, text in e.messages)
    if category in (*PASSAGE_CATEGORIES, "code"):
        assert all(e.source is not None and len(e.messages[0][1]) >= instruct.MIN_PASSAGE_CHARS * 0.8 for e in held)
    if category == "chat":
        assert any(len(e.messages) >= 3 for e in held)
        assert any(e.source is None for e in held) and any(e.source is not None for e in held)
    if category == "math":
        assert len({e.template for e in held}) >= 2 and all(any(ch.isdigit() for ch in e.messages[0][1]) for e in held)


def test_code_prompts_hold_a_real_stdlib_function_of_their_module() -> None:
    import ast

    for e in instruct.instruct_examples("code")[:20]:
        text = e.messages[0][1]
        code = text.split("```python\n", 1)[1].split("\n```", 1)[0]
        tree = ast.parse(code)
        assert isinstance(tree.body[0], (ast.FunctionDef, ast.AsyncFunctionDef))
        module = e.source.split("/", 1)[1]
        source = (python_source.stdlib_root() / f"{module}.py").read_text(encoding="utf-8")
        assert f"def {tree.body[0].name}(" in source


def test_prompts_go_through_the_chat_template(tok) -> None:
    for category in instruct.CATEGORIES:
        example = instruct.instruct_examples(category)[0]
        ids = instruct.instruct_prompts(category, tok, n=1)[0]
        assert ids == list(tok.apply_chat_template(example.as_messages(), add_generation_prompt=True,
                                                   return_dict=True)["input_ids"])
        text = tok.decode(ids)
        assert text.startswith("<|im_start|>user\n") and text.endswith("<|im_start|>assistant\n")
        assert text.count("<|im_start|>") == len(example.messages) + 1
        assert example.messages[-1][1] in text


def test_a_tokenizer_without_chat_template_is_a_one_line_error(tok) -> None:
    plain = tok.__class__(tokenizer_object=tok.backend_tokenizer)
    with pytest.raises(DynaTreeError) as err:
        instruct.instruct_prompts("math", plain, n=1)
    assert "\n" not in str(err.value) and "chat template" in str(err.value)


def test_prompt_cap_skips_longer_prompts_rather_than_cutting_them(tok) -> None:
    every = instruct.instruct_prompts("summarize", tok)
    cap = sorted(map(len, every))[len(every) // 2]
    capped = instruct.instruct_prompts("summarize", tok, max_prompt_tokens=cap)
    assert capped == [ids for ids in every if len(ids) <= cap]
    assert instruct.instruct_prompts("summarize", tok, max_prompt_tokens=cap, n=3) == capped[:3]
    with pytest.raises(DynaTreeError, match="max-prompt-tokens"):
        instruct.instruct_prompts("summarize", tok, max_prompt_tokens=cap, n=len(capped) + 1)


@pytest.mark.parametrize("bad", ["translate", "instruct-code", "", "Code"])
def test_unknown_category_is_a_one_line_error(bad: str) -> None:
    for call in (lambda: instruct.instruct_messages(bad), lambda: instruct.instruct_examples(bad, held_out=False)):
        with pytest.raises(DynaTreeError) as err:
            call()
        assert "\n" not in str(err.value) and "chat, summarize" in str(err.value)


def test_messages_are_fresh_copies() -> None:
    first = instruct.instruct_messages("math")
    first[0][0]["content"] = "changed"
    assert instruct.instruct_messages("math")[0][0]["content"] != "changed"


# ------------------------------------------------------------------------------ the bench's sets
def test_sets_are_registered_for_bench_and_list() -> None:
    assert set(instruct.SETS) <= set(PROMPT_SETS)
    assert {f"instruct-{c}" for c in instruct.CATEGORIES} | {"instruct"} == set(instruct.SETS)


def test_mixed_set_takes_the_categories_round_robin(tok) -> None:
    pairs = instruct.instruct_set("instruct", tok, 14, None)
    assert [c for c, _ in pairs] == [*instruct.CATEGORIES, *instruct.CATEGORIES, "chat", "summarize"]
    per_category = {c: instruct.instruct_prompts(c, tok, n=3) for c in instruct.CATEGORIES}
    for i, (category, ids) in enumerate(pairs):
        assert ids == per_category[category][i // len(instruct.CATEGORIES)]
    assert load_prompt_ids("instruct", tok, 14, 10_000) == [ids for _, ids in pairs]
    assert load_prompt_ids("instruct-qa", tok, 2, 10_000, seed=3) == instruct.instruct_prompts("qa", tok, n=2, seed=3)
    assert load_prompts("instruct-math", tok, 1, 10_000) == [tok.decode(per_category["math"][0])]


def test_bench_prompt_ids_carry_the_category(tok) -> None:
    from dynatree.cli.bench import RunArgs, _prompts

    prompts = _prompts(RunArgs(dataset="instruct", num_prompts=7, max_prompt_tokens=10_000, seed=2), tok)
    got = [instruct.row_category({"settings": {"dataset": "instruct"}, "prompt_id": p.id}) for p in prompts]
    assert got == [*instruct.CATEGORIES, "chat"]
    assert [list(p.ids) for p in prompts] == [ids for _, ids in instruct.instruct_set("instruct", tok, 7, 10_000, 2)]
    single = _prompts(RunArgs(dataset="instruct-code", num_prompts=1, max_prompt_tokens=10_000), tok)
    assert instruct.row_category({"settings": {"dataset": "instruct-code"}, "prompt_id": single[0].id}) == "code"
    assert instruct.row_category({"settings": {"dataset": "pydoc"}, "prompt_id": "pydoc:0:1"}) is None


def test_too_few_prompts_under_the_cap_is_a_one_line_error(tok) -> None:
    with pytest.raises(DynaTreeError) as err:
        load_prompt_ids("instruct-code", tok, 5, 40)
    assert "\n" not in str(err.value) and "instruct-code" in str(err.value)
    with pytest.raises(DynaTreeError):
        instruct.instruct_set("instruct-translate", tok, 1, None)
