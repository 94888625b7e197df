"""Spec-Bench's own questions as a bench prompt set: ``dynatree bench --dataset spec-bench``.

Spec-Bench (Xia et al., "Unlocking Efficiency in Large Language Model Inference: A Comprehensive
Survey of Speculative Decoding", Findings of ACL 2024) is the benchmark the field reports
speculative decoding on: 480 questions in six tasks, each method's speedup given per task because
how well a draft guesses depends on the task. Running its very questions makes our numbers
comparable with the papers' tables; the project's own instruct sets (:mod:`dynatree.bench.instruct`)
imitate its tasks with what every machine has offline, but are not its questions.

**Source.** ``data/spec_bench/question.jsonl`` of the public repository hemingkx/Spec-Bench at
commit :data:`COMMIT`, Apache-2.0, shipped byte for byte as package data
(``dynatree/assets/spec_bench/``, with its NOTICE and licence) so that a wheel runs it offline.
Where that copy is missing, the file is fetched once from GitHub at the same commit, checked
against :data:`SHA256` and cached (:func:`question_file`). A local file in the same format (one
``{"question_id", "category", "turns": [...]}`` object per line) may be given as a path instead.

**Tasks** (:data:`TASKS`, Spec-Bench's column order): ``mt_bench`` gathers MT-bench's eight
categories (:data:`MT_BENCH`, two turns each); ``translation``, ``summarization``, ``qa``,
``math_reasoning`` and ``rag`` are single categories of one turn. Spec-Bench's ``speed.py`` maps
them the same way.

**Selection.** ``--num-prompts`` counts *questions per task* (80 is all of Spec-Bench; a CPU run
may take 2). Each task's questions are taken round-robin over its categories, in file order within
a category, so two MT-bench questions are a writing and a roleplay one rather than two writing
ones; deterministic, no seed. A question any of whose turns renders to more than
``max_prompt_tokens`` tokens is skipped whole rather than cut: a cut chat prompt would lose the
question's end and the template's generation prompt.

**Prompts.** Every turn goes through the tokenizer's chat template, as the instruct sets do
(:func:`dynatree.integrations.chat.chat_prompt`). Each turn of a question is a prompt of its own
(prompt id ``spec-bench:<question_id>:<category>:t<turn>:<task>``); turn ``k`` > 1 is the
conversation [turn 1, answer 1, ..., turn k] whose answers are the *target's greedy
autoregressive answers* to the earlier turns, of at most the bench's ``max_new_tokens`` tokens
(:func:`greedy_answerer`). Spec-Bench lets every method answer the first turn itself; we build the
second-turn prompt once, from one reference answer, when the prompt set is built, because

* every method must see the same second-turn prompt for the outputs to be compared token for
  token and the timings to be timings of the same work: an exact method reproduces the greedy
  answer in float32, but in float16/bfloat16 a tree's verify may flip a near-tie, and its own
  answer would then give it another second-turn prompt;
* the answer comes from the same ``generate`` with the same strategy (autoregressive), engine and
  stopping as the bench's reference rows, so it is the answer the run's autoregressive row for
  that first turn records (in float32 and eager mode exactly; the test suite checks it);
* the bench's rows are keyed by their prompts' token hashes before anything runs: a prompt built
  from a row measured during the run would have no key in advance, and a resumed run could not
  tell which of its rows are done. Building it up front costs one greedy answer per MT-bench
  question (a progress bar shows them), repeated when a run is resumed.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dynatree.errors import DynaTreeError
from dynatree.text.files import jsonl_records, read_utf8

NAME = "spec-bench"  # the --dataset name, and the first field of every prompt id
REPOSITORY = "hemingkx/Spec-Bench"
COMMIT = "fd2c1cd7d2201ef71db4c5f4e455008f017967bf"
REPO_PATH = "data/spec_bench/question.jsonl"
SHA256 = "4b6d33e79484f9841c487ee87d1cf6aa8c6066f61d5d482ff09e5a007fafdf04"
URL = f"https://raw.githubusercontent.com/{REPOSITORY}/{COMMIT}/{REPO_PATH}"
PACKAGED = Path(__file__).resolve().parents[1] / "assets" / "spec_bench" / "question.jsonl"

#: MT-bench's categories, which Spec-Bench reports together as its multi-turn task.
MT_BENCH = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")
#: Spec-Bench's six tasks in its tables' column order.
TASKS = ("mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag")
TITLES = {"mt_bench": "MT-bench", "translation": "Translation", "summarization": "Summarization",
          "qa": "QA", "math_reasoning": "Math reasoning", "rag": "RAG"}
_TASK_OF = {**{c: "mt_bench" for c in MT_BENCH}, **{t: t for t in TASKS[1:]}}

Answer = Callable[[list[int]], list[int]]  # prompt ids -> the answer's ids


@dataclass(frozen=True)
class Question:
    """One line of the question file: its id, category and user turns (one, or two for MT-bench)."""

    question_id: int | str
    category: str
    turns: tuple[str, ...]

    @property
    def task(self) -> str:
        return _TASK_OF[self.category]

    def prompt_id(self, turn: int) -> str:
        """The bench's id of turn ``turn`` (1-based); :func:`row_task` reads the task back from it."""
        return f"{NAME}:{self.question_id}:{self.category}:t{turn}:{self.task}"


# ------------------------------------------------------------------------------------- the file
def is_specbench(name: str) -> bool:
    """Whether a ``--dataset`` value means Spec-Bench questions: the name ``spec-bench``, or a
    ``.jsonl`` file whose first record has ``turns`` (the question format) rather than ``text``."""
    if name == NAME:
        return True
    path = Path(name).expanduser()
    if path.suffix != ".jsonl" or not path.is_file():
        return False
    try:
        with open(path, "rb") as fh:
            for raw in fh:
                if raw.strip():
                    record = json.loads(raw.decode("utf-8-sig"))
                    return isinstance(record, dict) and "turns" in record
    except (OSError, ValueError):  # unreadable or not JSON: the prompt-file reader says why
        return False
    return False


def cache_path() -> Path:
    """Where a downloaded copy is kept (the user cache dir of the converted models), per commit."""
    from dynatree.loading.gguf import cache_dir

    return cache_dir() / "spec_bench" / COMMIT[:12] / "question.jsonl"


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _download(url: str) -> bytes:
    """The bytes at ``url`` (GitHub's raw file); every failure as one line."""
    try:
        with urllib.request.urlopen(url, timeout=60) as response:
            return response.read()
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", None) or exc
        raise DynaTreeError(f"Spec-Bench's question file is not in this installation and cannot be downloaded "
                            f"from {url} ({reason}); pass a local copy: --dataset path/to/question.jsonl") from None


def question_file(name: str = NAME, *, packaged: Path = PACKAGED, cache: Path | None = None,
                  download: Callable[[str], bytes] = _download) -> Path:
    """The question file a ``--dataset`` value names: a path as given; ``spec-bench`` the copy
    shipped in the package, else one downloaded earlier, else a fresh download from GitHub at
    :data:`COMMIT` (refused unless its SHA-256 is :data:`SHA256`, then cached). ``packaged``,
    ``cache`` and ``download`` are parameters so that the fallback can be tested offline."""
    if name != NAME:
        return Path(name).expanduser()
    if packaged.is_file():
        return packaged
    cache = cache if cache is not None else cache_path()
    if cache.is_file():
        return cache
    data = download(URL)
    digest = _sha256(data)
    if digest != SHA256:
        raise DynaTreeError(f"the file downloaded from {URL} has SHA-256 {digest[:12]}..., expected "
                            f"{SHA256[:12]}...: refusing a changed question file")
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=cache.parent, delete=False) as tmp:  # atomic: never half a file
            tmp.write(data)
        os.replace(tmp.name, cache)
    except OSError as exc:
        raise DynaTreeError(f"cannot write Spec-Bench's question file to {cache.parent} ({exc.strerror})") from None
    return cache


def _question(record: Any, where: str) -> Question:
    """One record checked: an object with an int or string id, a known category and its turns."""
    if not isinstance(record, dict) or not {"question_id", "category", "turns"} <= set(record):
        raise DynaTreeError(f'{where}: expected a Spec-Bench question {{"question_id", "category", "turns": [...]}}')
    qid, category, turns = record["question_id"], record["category"], record["turns"]
    if isinstance(qid, bool) or not isinstance(qid, (int, str)) or qid == "":
        raise DynaTreeError(f"{where}: question_id must be an integer or a non-empty string, got {qid!r}")
    if category not in _TASK_OF:
        raise DynaTreeError(f"{where}: unknown category {category!r}; Spec-Bench's are "
                            f"{', '.join(_TASK_OF)}")
    if (not isinstance(turns, list) or not turns
            or not all(isinstance(t, str) and t.strip() for t in turns)):
        raise DynaTreeError(f"{where}: turns must be a list of one or more non-empty strings")
    return Question(qid, category, tuple(turns))


def read_questions(path: Path) -> list[Question]:
    """Every question of a Spec-Bench-format file, in file order; one-line errors name the line."""
    questions: list[Question] = []
    seen: set[str] = set()
    for number, record in jsonl_records(read_utf8(path, "question file"), path):
        question = _question(record, f"{path}:{number}")
        if str(question.question_id) in seen:
            raise DynaTreeError(f"{path}:{number}: question_id {question.question_id!r} appears twice")
        seen.add(str(question.question_id))
        questions.append(question)
    if not questions:
        raise DynaTreeError(f"question file {path} contains no questions")
    return questions


def load_questions(name: str = NAME) -> list[Question]:
    """The questions of ``spec-bench`` (shipped, cached or downloaded) or of a local file."""
    path = question_file(name)
    if not path.exists():
        raise DynaTreeError(f"question file {path} does not exist")
    return read_questions(path)


def by_task(questions: Sequence[Question]) -> dict[str, list[Question]]:
    """Each present task's questions in selection order (:data:`TASKS` order): round-robin over the
    task's categories in order of first appearance, file order within a category."""
    out: dict[str, list[Question]] = {}
    for task in TASKS:
        categories: dict[str, list[Question]] = {}
        for q in questions:
            if q.task == task:
                categories.setdefault(q.category, []).append(q)
        if categories:
            out[task] = list(_round_robin(list(categories.values())))
    return out


def _round_robin(groups: list[list[Question]]) -> Iterator[Question]:
    for i in range(max(map(len, groups), default=0)):
        yield from (g[i] for g in groups if i < len(g))


def check(name: str, per_task: int | None = None) -> list[Question]:
    """Refuse, before any model loads, a question file that is missing or malformed or that has
    fewer than ``per_task`` questions in one of its tasks; return its questions."""
    questions = load_questions(name)
    if per_task is not None:
        if per_task < 1:
            raise DynaTreeError(f"--num-prompts (questions per task) must be at least 1, got {per_task}")
        for task, items in by_task(questions).items():
            if len(items) < per_task:
                raise DynaTreeError(f"'{name}' has only {len(items)} question(s) in task {task}, {per_task} requested "
                                    "(--num-prompts counts questions per task for Spec-Bench)")
    return questions


# ------------------------------------------------------------------------------------ prompt ids
def _render(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    from dynatree.integrations.chat import chat_prompt  # imports torch: only when prompts are tokenized

    return chat_prompt(tokenizer, messages)


def answer_text(tokenizer: Any, ids: Sequence[int]) -> str:
    """An answer's ids as the assistant turn of the next prompt: special tokens (the end-of-turn
    token) dropped and surrounding white space stripped, as Spec-Bench's ``eval.py`` does."""
    return tokenizer.decode(list(ids), skip_special_tokens=True).strip()


def _question_prompts(question: Question, tokenizer: Any, max_prompt_tokens: int | None,
                      answer: Answer | None, on_answer: Callable[[], None],
                      first_turn: bool = False) -> list[tuple[str, list[int]]] | None:
    """(prompt id, ids) of each turn of ``question`` (``first_turn``: of its first only); None if a
    turn is over the cap. A turn is checked before the target answers it, so a question whose first
    turn is too long costs no answer."""
    messages: list[dict[str, str]] = []
    out: list[tuple[str, list[int]]] = []
    for turn, text in enumerate(question.turns[:1] if first_turn else question.turns, start=1):
        if out:  # the target's answer to the previous turn joins the conversation
            if answer is None:
                raise DynaTreeError(f"question {question.question_id} has {len(question.turns)} turns: building the "
                                    "later turns' prompts needs the target's answers (pass answer=)")
            messages.append({"role": "assistant", "content": answer_text(tokenizer, answer(out[-1][1]))})
            on_answer()
        messages.append({"role": "user", "content": text})
        ids = _render(tokenizer, messages)
        if max_prompt_tokens is not None and len(ids) > max_prompt_tokens:
            return None
        out.append((question.prompt_id(turn), ids))
    return out


def specbench_prompts(name: str, tokenizer: Any, per_task: int, max_prompt_tokens: int | None = None,
                      answer: Answer | None = None, *, progress: bool = False,
                      first_turns: bool = False) -> list[tuple[str, list[int]]]:
    """(prompt id, ids) of the first ``per_task`` questions of each task (see the module docstring
    for the order, the cap and the later turns), interleaved task by task -- question 1 of every
    task, then question 2 ... -- each question's turns in a row, so that slow drifts of a machine
    hit every task alike. ``answer`` gives the target's greedy answer to a prompt
    (:func:`greedy_answerer`); it is needed only for questions of several turns. ``first_turns``:
    each question's first turn only (batches, where a later turn would follow each row's own answer)."""
    if per_task < 1 or (max_prompt_tokens is not None and max_prompt_tokens < 1):
        raise DynaTreeError("questions per task and max_prompt_tokens must be at least 1")
    tasks = by_task(check(name, per_task))
    answers = 0 if first_turns else sum(len(q.turns) - 1 for items in tasks.values() for q in items[:per_task])
    bar = _Bar(progress and answers > 0, answers)
    chosen: dict[str, list[list[tuple[str, list[int]]]]] = {}
    with bar:
        for task, items in tasks.items():
            picked = chosen.setdefault(task, [])
            for question in items:
                if len(picked) == per_task:
                    break
                prompts = _question_prompts(question, tokenizer, max_prompt_tokens, answer, bar.advance, first_turns)
                if prompts is not None:
                    picked.append(prompts)
            if len(picked) < per_task:
                raise DynaTreeError(f"'{name}' has only {len(picked)} question(s) in task {task} whose every turn "
                                    f"fits {max_prompt_tokens} prompt tokens, {per_task} requested "
                                    "(raise --max-prompt-tokens; 2048 fits every Spec-Bench question with "
                                    "SmolLM2's tokenizer)")
    return [pair for i in range(per_task) for task in chosen for pair in chosen[task][i]]


class _Bar:
    """A rich progress bar over the answers to earlier turns (seconds each on a CPU), or nothing."""

    def __init__(self, enabled: bool, total: int) -> None:
        self.enabled, self.total, self.done = enabled, total, 0

    def __enter__(self) -> "_Bar":
        if self.enabled:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._p = Progress(TextColumn("[bold]Spec-Bench: the target's answers to first turns"), BarColumn(),
                               MofNCompleteColumn(), TimeElapsedColumn(), transient=True)
            self._p.start()
            self._t = self._p.add_task("answers", total=self.total)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.enabled:
            self._p.stop()

    def advance(self) -> None:
        self.done += 1
        if self.enabled:
            self._p.update(self._t, total=max(self.total, self.done), completed=self.done)


def greedy_answerer(target: Any, max_new_tokens: int, options: Any = None,
                    eos_token_id: int | Sequence[int] | None = None) -> Answer:
    """The target's greedy answer to a prompt, from the bench's own autoregressive decoding:
    ``generate`` with strategy ``autoregressive``, ``options`` (an :class:`~dynatree.options.EngineOptions`;
    compiling is switched off, the answer is the same) and the bench's stopping (``eos_token_id``
    None: the target's own end token), capped at ``max_new_tokens``."""
    from dynatree.loop.generate import generate
    from dynatree.options import EngineOptions, StoppingConfig

    engine = (options or EngineOptions()).replace(compile=False)
    stopping = StoppingConfig(eos_token_id=eos_token_id)

    def answer(ids: list[int]) -> list[int]:
        result = generate(target, None, list(ids), "autoregressive", max_new_tokens=max_new_tokens,
                          stopping=stopping, options=engine)
        return result.sequences[0, result.stats.prompt_tokens:].tolist()

    return answer


# ------------------------------------------------------------------------------------ result rows
def row_task(row: Mapping[str, Any]) -> tuple[str, str] | None:
    """(task, question) of a bench row of Spec-Bench questions, from its prompt id; None for any
    other row. ``question`` names the question (its turns share it): Spec-Bench times a two-turn
    question as one (both turns' tokens over both turns' time)."""
    parts = str(row.get("prompt_id", "")).split(":")
    if len(parts) < 5 or parts[0] != NAME or parts[-1] not in TASKS or not parts[-2].startswith("t"):
        return None
    return parts[-1], ":".join(parts[:-2])
