"""Spec-Bench's question set as a bench prompt set: the shipped file, the task mapping, the
selection per task, MT-bench's second turns built from the target's greedy answer, one-line errors
before any model loads, the offline fallback of the download, and one ``dynatree bench`` run on
tiny models over a small question file written here (one- and two-turn questions).

No timing is asserted anywhere: the tables' arithmetic is checked on fake rows in
tests/bench/test_specbench.py; here only which rows exist and which prompts they measured.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli_helpers import error_lines
from dynatree.bench import specbench_questions as sq
from dynatree.bench.datasets import check_prompt_set, load_prompt_ids, load_prompts
from dynatree.bench.runner import Prompt
from dynatree.bench.specbench import specbench_tables
from dynatree.cli import app
from dynatree.errors import DynaTreeError
from dynatree.integrations.chat import chat_prompt
from tiny_tok import tiny_tokenizer

# Two questions per category, in file order; the MT-bench ones have two turns. Ids follow
# Spec-Bench's layout (MT-bench first), but the categories are interleaved to check the grouping.
SMALL = [
    {"question_id": 1, "category": "writing", "turns": ["Write a poem about the fox.", "Now make it rhyme."]},
    {"question_id": 2, "category": "roleplay", "turns": ["Pretend to be a dog.", "Now bark twice."]},
    {"question_id": 3, "category": "writing", "turns": ["Write a note to the dog.", "Shorten it."]},
    {"question_id": 4, "category": "translation", "turns": ["Translate German to English: der Fuchs"]},
    {"question_id": 5, "category": "summarization", "turns": ["Summarize: the quick brown fox jumps."]},
    {"question_id": 6, "category": "qa", "turns": ["Who jumps over the lazy dog?"]},
    {"question_id": 7, "category": "math_reasoning", "turns": ["What is 2 + 3?"]},
    {"question_id": 8, "category": "rag", "turns": ["Passage: the fox is brown. Question: what colour is it?"]},
    {"question_id": 9, "category": "translation", "turns": ["Translate German to English: der Hund"]},
    {"question_id": 10, "category": "summarization", "turns": ["Summarize: the lazy dog sleeps."]},
    {"question_id": 11, "category": "qa", "turns": ["What does the fox do?"]},
    {"question_id": 12, "category": "math_reasoning", "turns": ["What is 7 - 4?"]},
    {"question_id": 13, "category": "rag", "turns": ["Passage: the dog is lazy. Question: is it quick?"]},
    {"question_id": 14, "category": "roleplay", "turns": ["Pretend to be a fox.", "Now say hello."]},
]


def write_questions(path: Path, records: list = SMALL) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


@pytest.fixture()
def small(tmp_path: Path) -> Path:
    return write_questions(tmp_path / "question.jsonl")


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


# ------------------------------------------------------------------------------ the shipped file
def test_the_shipped_file_is_spec_benchs_480_questions_byte_for_byte() -> None:
    assert hashlib.sha256(sq.PACKAGED.read_bytes()).hexdigest() == sq.SHA256
    assert (sq.PACKAGED.parent / "NOTICE.md").is_file() and (sq.PACKAGED.parent / "LICENSE").is_file()
    assert sq.COMMIT in (sq.PACKAGED.parent / "NOTICE.md").read_text(encoding="utf-8")
    questions = sq.load_questions("spec-bench")
    tasks = sq.by_task(questions)
    assert list(tasks) == list(sq.TASKS) and {t: len(q) for t, q in tasks.items()} == dict.fromkeys(sq.TASKS, 80)
    assert {q.category for q in tasks["mt_bench"]} == set(sq.MT_BENCH)
    assert all(len(q.turns) == 2 for q in tasks["mt_bench"])
    assert all(len(q.turns) == 1 for t in sq.TASKS[1:] for q in tasks[t])
    # round-robin over MT-bench's categories: the first eight are one of each, in file order
    assert [q.category for q in tasks["mt_bench"][:8]] == list(sq.MT_BENCH)


# ------------------------------------------------------------------------------------- the loader
def test_tasks_group_mt_bench_categories_and_take_them_round_robin(small: Path) -> None:
    tasks = sq.by_task(sq.read_questions(small))
    assert list(tasks) == list(sq.TASKS)
    assert [q.question_id for q in tasks["mt_bench"]] == [1, 2, 3, 14]  # writing, roleplay, writing, roleplay
    assert [q.question_id for q in tasks["translation"]] == [4, 9]
    assert [q.question_id for q in tasks["rag"]] == [8, 13]


def test_prompts_are_n_per_task_interleaved_and_turns_go_through_the_chat_template(small: Path, tok) -> None:
    asked: list[list[int]] = []
    replies = iter(["A poem.", "I am a dog."])

    def answer(ids: list[int]) -> list[int]:
        asked.append(ids)
        return tok(next(replies))["input_ids"] + [tok.eos_token_id]  # the end-of-turn token is dropped

    pairs = sq.specbench_prompts(str(small), tok, 2, 10_000, answer)
    assert [pid for pid, _ in pairs] == [
        "spec-bench:1:writing:t1:mt_bench", "spec-bench:1:writing:t2:mt_bench",
        "spec-bench:4:translation:t1:translation", "spec-bench:5:summarization:t1:summarization",
        "spec-bench:6:qa:t1:qa", "spec-bench:7:math_reasoning:t1:math_reasoning", "spec-bench:8:rag:t1:rag",
        "spec-bench:2:roleplay:t1:mt_bench", "spec-bench:2:roleplay:t2:mt_bench",
        "spec-bench:9:translation:t1:translation", "spec-bench:10:summarization:t1:summarization",
        "spec-bench:11:qa:t1:qa", "spec-bench:12:math_reasoning:t1:math_reasoning", "spec-bench:13:rag:t1:rag"]
    ids = dict(pairs)
    first = [{"role": "user", "content": SMALL[0]["turns"][0]}]
    assert ids["spec-bench:1:writing:t1:mt_bench"] == chat_prompt(tok, first)
    second = [*first, {"role": "assistant", "content": "A poem."}, {"role": "user", "content": "Now make it rhyme."}]
    assert ids["spec-bench:1:writing:t2:mt_bench"] == chat_prompt(tok, second)
    assert ids["spec-bench:4:translation:t1:translation"] == chat_prompt(
        tok, [{"role": "user", "content": "Translate German to English: der Fuchs"}])
    # one answer per two-turn question, to exactly its first turn's prompt
    assert asked == [ids["spec-bench:1:writing:t1:mt_bench"], ids["spec-bench:2:roleplay:t1:mt_bench"]]


def test_a_question_over_the_prompt_cap_is_skipped_whole_and_a_long_first_turn_costs_no_answer(tmp_path: Path,
                                                                                                 tok) -> None:
    long = {"question_id": 0, "category": "writing", "turns": ["fox " * 1000, "Again."]}
    path = write_questions(tmp_path / "q.jsonl", [long, *SMALL])
    asked: list[list[int]] = []

    def answer(ids: list[int]) -> list[int]:
        asked.append(ids)
        return tok("Yes.")["input_ids"]

    cap = 600
    assert len(chat_prompt(tok, [{"role": "user", "content": long["turns"][0]}])) > cap
    pairs = sq.specbench_prompts(str(path), tok, 1, cap, answer)
    # mt_bench's order is writing 0, roleplay 2, writing 1, ...: question 0 is skipped, unanswered
    assert [pid for pid, _ in pairs][:2] == ["spec-bench:2:roleplay:t1:mt_bench", "spec-bench:2:roleplay:t2:mt_bench"]
    assert asked == [pairs[0][1]] and all(len(ids) <= cap for _, ids in pairs)
    with pytest.raises(DynaTreeError, match=r"has only 0 question\(s\) in task mt_bench whose every turn fits 5 "):
        sq.specbench_prompts(str(path), tok, 1, 5, answer)


def test_two_turn_questions_need_an_answerer(small: Path, tok) -> None:
    with pytest.raises(DynaTreeError, match="needs the target's answers"):
        sq.specbench_prompts(str(small), tok, 1, 10_000)


def test_the_corpus_loaders_refuse_spec_bench_in_one_line(small: Path, tok) -> None:
    for name in ("spec-bench", str(small)):
        for load in (load_prompts, load_prompt_ids):
            with pytest.raises(DynaTreeError) as info:
                load(name, tok, 1, 64)
            assert "Spec-Bench's question set" in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("line, message", [
    ('{"question_id": 99, "category": "writing"', ":15: not valid JSON"),
    ('{"question_id": 99, "category": "writing"}', ':15: expected a Spec-Bench question {"question_id", "category", '
                                                   '"turns": [...]}'),
    ('{"question_id": 99, "category": "poetry", "turns": ["x"]}', ":15: unknown category 'poetry'; Spec-Bench's are "
                                                                  "writing, roleplay"),
    ('{"question_id": 99, "category": "qa", "turns": []}', ":15: turns must be a list of one or more non-empty strings"),
    ('{"question_id": 99, "category": "qa", "turns": ["x", 3]}', ":15: turns must be a list"),
    ('{"question_id": true, "category": "qa", "turns": ["x"]}', ":15: question_id must be an integer or a non-empty"),
    ('{"question_id": 3, "category": "qa", "turns": ["x"]}', ":15: question_id 3 appears twice"),
])
def test_a_bad_question_file_is_one_line_naming_its_line(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "q.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in SMALL) + line + "\n", encoding="utf-8")
    with pytest.raises(DynaTreeError) as info:
        check_prompt_set(str(path), 1)
    assert str(info.value).startswith(f"{path}{message}") and "\n" not in str(info.value)


def test_too_few_questions_in_a_task_and_a_file_that_is_not_utf8(small: Path, tmp_path: Path) -> None:
    with pytest.raises(DynaTreeError, match=r"has only 2 question\(s\) in task translation, 3 requested "
                                            r"\(--num-prompts counts questions per task"):
        check_prompt_set(str(small), 3)
    check_prompt_set(str(small), 2)  # mt_bench has 4, every other task 2
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(json.dumps(SMALL[0]).encode() + b"\n" + b'{"turns": ["\xff"]}\n')
    with pytest.raises(DynaTreeError, match=f"question file {bad} is not UTF-8 text: byte 0xff"):
        check_prompt_set(str(bad), 1)


def test_row_task_reads_the_task_and_the_question_from_the_prompt_id() -> None:
    assert sq.row_task({"prompt_id": "spec-bench:81:writing:t2:mt_bench"}) == ("mt_bench", "spec-bench:81:writing")
    assert sq.row_task({"prompt_id": "spec-bench:a:b:c:qa:t1:qa"}) == ("qa", "spec-bench:a:b:c:qa")
    for other in ("instruct:0:3:code", "pydoc:0:1", "spec-bench:1:writing:t1:poetry", ""):
        assert sq.row_task({"prompt_id": other}) is None


# ------------------------------------------------------------------------ the download, offline
def test_without_the_shipped_copy_the_file_is_downloaded_checked_and_cached(tmp_path: Path) -> None:
    real = sq.PACKAGED.read_bytes()
    cache = tmp_path / "cache" / "question.jsonl"
    urls: list[str] = []

    def fake(url: str) -> bytes:
        urls.append(url)
        return real

    missing = tmp_path / "not-shipped.jsonl"
    assert sq.question_file("spec-bench", packaged=missing, cache=cache, download=fake) == cache
    assert cache.read_bytes() == real and urls == [sq.URL] and sq.COMMIT in sq.URL
    assert sq.question_file("spec-bench", packaged=missing, cache=cache, download=fake) == cache
    assert len(urls) == 1  # the cached copy is used
    other = tmp_path / "other" / "question.jsonl"
    with pytest.raises(DynaTreeError, match="refusing a changed question file"):
        sq.question_file("spec-bench", packaged=missing, cache=other, download=lambda url: real + b"\n")
    assert not other.exists()
    assert sq.question_file("spec-bench", packaged=sq.PACKAGED, cache=other, download=fake) == sq.PACKAGED


# ------------------------------------------------------------------------------------ the CLI
def test_bench_refuses_a_bad_question_file_before_loading_a_model(small: Path, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from dynatree.loading import models

    monkeypatch.setattr(models, "load_model", lambda *a, **k: pytest.fail("a model was loaded"))
    bad = tmp_path / "bad.jsonl"
    bad.write_text(small.read_text(encoding="utf-8") + '{"question_id": 99, "category": "poetry", "turns": ["x"]}\n',
                   encoding="utf-8")
    for dataset, n, message in ((str(bad), "1", f"error: {bad}:15: unknown category 'poetry'"),
                                (str(small), "3", f"error: '{small}' has only 2 question(s) in task translation")):
        res = CliRunner().invoke(app, ["bench", "--dataset", dataset, "--num-prompts", n,
                                       "--output", str(tmp_path / "r.jsonl")])
        assert res.exit_code == 2, res.output
        assert "Traceback" not in res.output
        [line] = error_lines(res.stderr)
        assert line.startswith(message)


def test_bench_runs_a_question_file_per_task_with_hf_rows_and_the_same_second_turn_for_all(
        model_dirs, small: Path, tmp_path: Path, tok) -> None:
    out = tmp_path / "r.jsonl"
    labels = ["autoregressive", "dynatree", "hf-generate", "hf-prompt-lookup", "hf-assisted"]
    res = CliRunner().invoke(app, ["bench", "--target", model_dirs[0], "--draft", model_dirs[1], "--dataset", str(small),
                                   "--num-prompts", "2", "--max-new-tokens", "8", "--max-prompt-tokens", "1024",
                                   "--strategies", ",".join(labels), "--warmup", "0", "--output", str(out),
                                   "--no-progress"])
    assert res.exit_code == 0, res.output
    rows = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    prompts = ["spec-bench:1:writing:t1:mt_bench", "spec-bench:1:writing:t2:mt_bench",
               "spec-bench:2:roleplay:t1:mt_bench", "spec-bench:2:roleplay:t2:mt_bench",
               *(f"spec-bench:{q}:{c}:t1:{c}" for q, c in ((4, "translation"), (9, "translation"),
                                                           (5, "summarization"), (10, "summarization"), (6, "qa"),
                                                           (11, "qa"), (7, "math_reasoning"), (12, "math_reasoning"),
                                                           (8, "rag"), (13, "rag")))]
    for label in labels:
        assert sorted(r["prompt_id"] for r in rows if r["label"] == label) == sorted(prompts), label
    assert all(r["greedy_match"] for r in rows if r["label"] != "autoregressive")

    # The second turn: one prompt for every method, built from the autoregressive answer of this run.
    by = {(r["label"], r["prompt_id"]): r for r in rows}
    for q, first, second in ((1, SMALL[0], "writing"), (2, SMALL[1], "roleplay")):
        answer = by[("autoregressive", f"spec-bench:{q}:{second}:t1:mt_bench")]["output_ids"]
        messages = [{"role": "user", "content": first["turns"][0]},
                    {"role": "assistant", "content": sq.answer_text(tok, answer)},
                    {"role": "user", "content": first["turns"][1]}]
        sha = Prompt("x", tuple(chat_prompt(tok, messages))).sha
        assert {by[(label, f"spec-bench:{q}:{second}:t2:mt_bench")]["prompt_sha"] for label in labels} == {sha}

    [table] = specbench_tables(rows)
    assert table.layout == "spec-bench" and table.tasks == list(sq.TASKS)
    assert table.questions == dict.fromkeys(sq.TASKS, 2)
    assert table.methods == labels and table.hf_reference == "hf-generate"
    assert all(table.speedup[label][t] is not None and table.hf_speedup[label][t] is not None
               for label in labels for t in sq.TASKS)
    assert table.speedup["autoregressive"] == dict.fromkeys(sq.TASKS, pytest.approx(1.0))
    assert table.hf_speedup["hf-generate"] == dict.fromkeys(sq.TASKS, pytest.approx(1.0))
    header = "| Method | MT-bench | Translation | Summarization | QA | Math reasoning | RAG | Overall |"
    assert header + " τ (tokens/round) |" in res.stderr and res.stderr.count(header) == 2  # over AR and over HF
    assert "Speedup over HF `generate` (greedy, the `hf-generate` rows)" in res.stderr

    rep = CliRunner().invoke(app, ["report", str(out), "--out", str(tmp_path / "rep")])
    assert rep.exit_code == 0, rep.output
    assert "## Spec-Bench (1): " in rep.stdout and rep.stdout.count(header) == 2
    assert "## Spec-Bench (1): " in (tmp_path / "rep" / "report.md").read_text(encoding="utf-8")
