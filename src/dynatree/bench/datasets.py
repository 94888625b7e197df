"""Prompt sets for benchmarks, most of them available offline.

Provenance of each set:

* ``pydoc`` — the Python language reference as shipped inside CPython (``pydoc_data.topics``, the
  text ``help()`` shows). Always available. Raw topics mix prose with grammar productions
  (``if_stmt ::= ...``), code examples and headings; prompts built from those make a small model
  loop on grammar fragments, so only prose paragraphs are kept: unindented paragraphs that end a
  sentence, have at least :data:`dynatree.text.prose.MIN_WORDS` words and few code symbols.
* ``licenses`` — the licence texts Debian ships in ``/usr/share/common-licenses`` (GPL, Apache,
  MPL, ...), deduplicated where one name links to another. Clean legal prose with natural
  continuations. Only on Debian-like systems.
* ``wikitext2`` — WikiText-2 (raw), test split, from the Hugging Face hub (``Salesforce/wikitext``)
  through the ``datasets`` package; Wikipedia articles. The DynaTree paper caps these prompts at 800 tokens.
* ``pg19`` — PG-19 test split (Project Gutenberg books published before 1919), the parquet copy
  ``emozilla/pg19-test`` of DeepMind's set (whose loading script current ``datasets`` no longer
  runs). The DynaTree paper caps these prompts at 1000 tokens.
* ``wiki-offline`` — the held-out articles of the offline Wikipedia corpus (106 articles of a 2017
  English Wikipedia dump shipped as test data in PyPI's ``gensim`` wheel; CC BY-SA 3.0,
  Wikipedia contributors), a WikiText-2 stand-in that needs no hub. See :mod:`dynatree.text.corpora`.
* ``books-offline`` — the held-out chapters of six Jane Austen novels and *Moby Dick* (Project
  Gutenberg texts in Debian's ``r-cran-janeaustenr`` / ``r-cran-tokenizers``), a PG-19 stand-in.
  Only held-out documents are used, so a draft distilled on the training part (``dynatree
  distill``) is never scored on text it was trained on.
* ``instruct``, ``instruct-<category>`` — chat-templated instruct requests in Spec-Bench's six
  categories, built offline with a held-out split; see :mod:`dynatree.bench.instruct`.
* ``spec-bench`` — Spec-Bench's own 480 questions (hemingkx/Spec-Bench, shipped in the package),
  chat-templated, MT-bench's second turns included; ``num_prompts`` counts questions per task.
  A ``.jsonl`` file of questions in its format (records with ``turns``) is read the same way.
  See :mod:`dynatree.bench.specbench_questions`.
* a local file — ``.txt`` (one prompt per paragraph, paragraphs separated by blank lines) or
  ``.jsonl`` (one prompt per line, in the field ``text`` or ``prompt``), used as written.

How prompts are built: a corpus is a list of documents, each made of runs of consecutive clean
paragraphs (a dropped paragraph ends a run, so a prompt never jumps over a removed code block).
A passage starts at the start of a paragraph, continues through the following paragraphs of its
run, and is cut at ``max_prompt_tokens`` tokens of the given tokenizer; the next passage starts at
the next paragraph not yet used, so passages never overlap. Documents are shuffled with ``seed``
and passages are taken round-robin, one document at a time, so a set spreads over many documents
and depends only on (name, tokenizer, num_prompts, max_prompt_tokens, seed). Local files keep
their own order and one prompt per paragraph or record: they are the user's prompts.
"""

from __future__ import annotations

import itertools
import json
import random
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

from transformers import PreTrainedTokenizerBase

from dynatree.text import corpora
from dynatree.text import prose
from dynatree.text.files import jsonl_records, read_utf8
from dynatree.bench import instruct, specbench_questions
from dynatree.catalog import PROMPT_SETS
from dynatree.errors import DynaTreeError

def pydoc_documents() -> list[prose.Document]:
    """One document per pydoc topic, in the topic order of ``pydoc_data.topics``."""
    return [document for document in (prose.pydoc_runs(t.text) for t in corpora.pydoc_texts()) if document]


def license_documents(directory: Path = corpora.LICENCES_DIR) -> list[prose.Document]:
    """One document per distinct licence file (symlinks like GPL -> GPL-3 are read once), by file name."""
    if not directory.is_dir():
        raise DynaTreeError(
            f"the 'licenses' prompt set needs {directory} (Debian's common-licenses); use --dataset pydoc"
        )
    texts = sorted(corpora.licence_texts(directory), key=lambda t: t.name)
    return [document for document in (prose.prose_runs(t.text) for t in texts) if document]


def _load_hub_dataset(name: str, *args: str, split: str):  # returns datasets.Dataset
    """``datasets.load_dataset`` with every failure (package missing, hub unreachable) as one line."""
    try:
        import datasets
    except ImportError:
        raise DynaTreeError(
            f"prompt set from {name} needs the 'datasets' package: pip install datasets (or use --dataset pydoc)"
        ) from None
    try:
        return datasets.load_dataset(name, *args, split=split)
    except Exception as exc:  # network, hub and cache errors come in many types; all mean "not reachable"
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise DynaTreeError(f"cannot load {name} from the HF hub ({first}); use --dataset pydoc") from exc


_WIKITEXT_FIXES = ((" @-@ ", "-"), (" @,@ ", ","), (" @.@ ", "."), (" 's", "'s"))


def _detokenize_wikitext(line: str) -> str:
    """Undo WikiText's tokenization artefacts (``1 @,@ 000``, spaces before commas) for readable prompts."""
    for old, new in _WIKITEXT_FIXES:
        line = line.replace(old, new)
    return re.sub(r" ([.,;:!?)])", r"\1", re.sub(r"\( ", "(", line)).strip()


def wikitext2_documents() -> list[prose.Document]:
    """WikiText-2 raw test split, one document per article (`` = Title = `` lines start one)."""
    rows = _load_hub_dataset("Salesforce/wikitext", "wikitext-2-raw-v1", split="test")["text"]
    articles: list[list[str | None]] = []
    for row in rows:
        line = row.strip()
        if re.fullmatch(r"= [^=].* =", line):
            articles.append([])
        elif line.startswith("="):  # a section heading ends a run
            if articles:
                articles[-1].append(None)
        elif line and articles:
            paragraph = _detokenize_wikitext(line)
            articles[-1].append(paragraph if prose.is_prose(paragraph) else None)
    return [document for document in map(prose.runs, articles) if document]


def pg19_documents() -> list[prose.Document]:
    """PG-19 test split, one document per book."""
    books = _load_hub_dataset("emozilla/pg19-test", split="test")["text"]
    return [document for document in map(prose.prose_runs, books) if document]


def offline_documents(corpus: str) -> list[prose.Document]:
    """The held-out documents of an offline corpus of :mod:`dynatree.text.corpora` as prose runs."""
    held = corpora.split(corpora.load(corpus), held_out=True)
    return [document for document in (prose.prose_runs(t.text) for t in held) if document]


def _passages(
    document: prose.Document, tokenizer: PreTrainedTokenizerBase, max_prompt_tokens: int
) -> Iterator[str]:
    """Non-overlapping passages of a document, each starting at a paragraph and cut at the token cap."""
    for run in document:
        start = 0
        while start < len(run):
            text, used = "", 0
            for paragraph in run[start:]:
                text = f"{text}\n\n{paragraph}" if text else paragraph
                used += 1
                if _count_tokens(tokenizer, text) >= max_prompt_tokens:
                    break
            yield cut_to_tokens(text, tokenizer, max_prompt_tokens)
            start += used


def _count_tokens(tokenizer: PreTrainedTokenizerBase, text: str) -> int:
    return len(tokenizer(text)["input_ids"])


def cut_to_tokens(text: str, tokenizer: PreTrainedTokenizerBase, max_tokens: int) -> str:
    """The longest prefix of ``text`` (at a token boundary) that encodes to at most ``max_tokens`` ids.

    Counts include the special tokens the tokenizer adds by default (e.g. BOS), because that is
    what the model will see. Cutting is done on the text, not by decoding ids, so the prompt keeps
    its exact spelling; re-encoding a cut prefix can merge differently at the edge, hence the check.
    """
    if _count_tokens(tokenizer, text) <= max_tokens:
        return text
    try:
        encoding = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        ends = [end for _, end in encoding["offset_mapping"]]

        def prefix_of(n: int) -> str:
            return text[: ends[n - 1]]
    except NotImplementedError:  # Python (slow) tokenizers have no offsets: decode the ids instead
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]

        def prefix_of(n: int) -> str:
            return tokenizer.decode(ids[:n])

    keep = max_tokens - _count_tokens(tokenizer, "")
    while keep > 0:
        prefix = prefix_of(keep).rstrip()
        if _count_tokens(tokenizer, prefix) <= max_tokens:
            return prefix
        keep -= 1
    raise DynaTreeError(f"max_prompt_tokens={max_tokens} leaves no room for text with this tokenizer")


def _read_local(path: Path) -> list[str]:
    """Prompts of a local .txt (blank-line separated) or .jsonl (``text``/``prompt``) file, in order.

    The file must be UTF-8 text (:func:`read_utf8`). A NUL wanted inside a prompt is written
    ``\\u0000`` in .jsonl.
    """
    content = read_utf8(path)
    if path.suffix == ".txt":
        prompts = [block.strip() for block in prose.paragraphs(content)]
    elif path.suffix == ".jsonl":
        prompts = []
        for number, record in jsonl_records(content, path):
            text = record.get("text", record.get("prompt")) if isinstance(record, dict) else None
            if not isinstance(text, str):
                raise DynaTreeError(f"{path}:{number}: expected an object with a string field 'text' or 'prompt'")
            if text.strip():
                prompts.append(text)
    else:
        raise DynaTreeError(f"prompt file {path} must be .txt (blank-line separated) or .jsonl")
    if not prompts:
        raise DynaTreeError(f"prompt file {path} contains no prompts")
    return prompts


def _corpus(name: str) -> list[prose.Document]:
    builders = {
        "pydoc": pydoc_documents,
        "licenses": license_documents,
        "wikitext2": wikitext2_documents,
        "pg19": pg19_documents,
        "wiki-offline": lambda: offline_documents("wiki"),
        "books-offline": lambda: offline_documents("books"),
    }
    return builders[name]()


def _round_robin(iterators: list[Iterator[str]]) -> Iterator[str]:
    """One item from each iterator in turn, dropping iterators as they run out."""
    while iterators:
        alive = []
        for iterator in iterators:
            item = next(iterator, None)
            if item is not None:
                alive.append(iterator)
                yield item
        iterators = alive


def _unique(items: Iterable[str]) -> Iterator[str]:
    """The items in order without repeats, lazily (a corpus is only tokenized as far as needed)."""
    seen: set[str] = set()
    for item in items:
        if item not in seen:
            seen.add(item)
            yield item


def check_prompt_set(name: str, num_prompts: int | None = None) -> None:
    """Refuse a prompt set that is neither a named set nor a readable prompt file, without a
    tokenizer: the CLI asks before it loads a model (seconds), which the prompts' tokens need. A
    file is read (it is small), so one that is not UTF-8 text, or has fewer than ``num_prompts``
    prompts, is refused then too."""
    if specbench_questions.is_specbench(name):  # per task: --num-prompts counts questions per task
        specbench_questions.check(name, num_prompts)
    elif name not in PROMPT_SETS and not instruct.is_instruct_set(name):
        prompts = _read_local(_prompt_file(name))
        if num_prompts is not None and len(prompts) < num_prompts:
            raise DynaTreeError(f"'{name}' has only {len(prompts)} prompts, {num_prompts} requested")


def _prompt_file(name: str) -> Path:
    """The local file a prompt set name that is no named set points to (refused when there is none)."""
    path = Path(name).expanduser()
    if not path.exists():
        raise DynaTreeError(f"unknown prompt set '{name}': use one of {', '.join(PROMPT_SETS)} or a .txt/.jsonl file")
    return path


def _refuse_specbench(name: str) -> None:
    """Spec-Bench's second turns hold the target's answers: its prompts need the model, which these
    tokenizer-only loaders do not have."""
    if specbench_questions.is_specbench(name):
        raise DynaTreeError(f"'{name}' is Spec-Bench's question set: its MT-bench second turns need the target's "
                            "answers; build its prompts with dynatree.bench.specbench_questions.specbench_prompts "
                            "(dynatree bench does)")


def load_prompts(
    name: str,
    tokenizer: PreTrainedTokenizerBase,
    num_prompts: int,
    max_prompt_tokens: int,
    seed: int = 0,
) -> list[str]:
    """``num_prompts`` prompts of at most ``max_prompt_tokens`` tokens from a named set or a local file.

    ``name`` is a key of :data:`PROMPT_SETS` or a path to a ``.txt``/``.jsonl`` file. Fewer
    available prompts than requested is an error rather than a silently smaller benchmark.
    """
    if num_prompts < 1 or max_prompt_tokens < 1:
        raise DynaTreeError("num_prompts and max_prompt_tokens must be at least 1")
    _refuse_specbench(name)
    if instruct.is_instruct_set(name):  # chat-templated conversations, not passages of a corpus
        return instruct.instruct_texts(name, tokenizer, num_prompts, max_prompt_tokens, seed)
    if name in PROMPT_SETS:
        documents = _corpus(name)
        random.Random(seed).shuffle(documents)
        passages = _round_robin([_passages(doc, tokenizer, max_prompt_tokens) for doc in documents])
        # Versions of one licence share whole paragraphs; a repeated prompt would only be weighted twice.
        prompts = list(itertools.islice(_unique(passages), num_prompts))
    else:
        texts = _read_local(_prompt_file(name))[:num_prompts]
        prompts = [cut_to_tokens(text, tokenizer, max_prompt_tokens) for text in texts]
    if len(prompts) < num_prompts:
        raise DynaTreeError(f"'{name}' has only {len(prompts)} prompts, {num_prompts} requested")
    return prompts


def load_prompt_ids(
    name: str,
    tokenizer: PreTrainedTokenizerBase,
    num_prompts: int,
    max_prompt_tokens: int,
    seed: int = 0,
) -> list[list[int]]:
    """The prompts of :func:`load_prompts` as token ids (with the tokenizer's default special tokens)."""
    _refuse_specbench(name)
    if instruct.is_instruct_set(name):  # the chat template's own ids: decoding and re-encoding may differ
        return [ids for _, ids in instruct.instruct_set(name, tokenizer, num_prompts, max_prompt_tokens, seed)]
    prompts = load_prompts(name, tokenizer, num_prompts, max_prompt_tokens, seed)
    return [tokenizer(prompt)["input_ids"] for prompt in prompts]
