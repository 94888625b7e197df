"""Instruct workloads in Spec-Bench's layout: one prompt set per task category, built offline.

Spec-Bench (Xia et al. 2024) measures speculative decoding on six kinds of requests to a chat
model, because how much a draft guesses right depends on the task: an answer that copies its input
(a summary, a rewrite, an edited function) is easy to draft, a free answer is not. The sets here
follow its categories with what this project has on every machine:

* ``chat`` -- multi-turn conversations (Spec-Bench: MT-bench): hand-written two-turn talks, and
  conversations about a passage whose earlier assistant turns are facts read off the passage;
* ``summarize`` -- summarize a passage (Spec-Bench: CNN/Daily Mail);
* ``qa`` -- answer a question over a given passage (Spec-Bench: Natural Questions with retrieved
  documents); questions are generated from the passage (an "if"/"when" clause, a repeated term);
* ``rewrite`` -- rewrite, paraphrase or reformat a passage (in place of Spec-Bench's translation,
  which a 135M English model cannot do);
* ``code`` -- edit a given Python function (type hints, renames, refactors ...);
* ``math`` -- word problems with random numbers (Spec-Bench: GSM8K).

Passages come from :mod:`dynatree.text.corpora` (the Python language reference of ``pydoc_data``, one
version per family of Debian's licence texts) and from the docstrings of the standard library's
modules; functions come from the standard library's source (``sysconfig.get_paths()["stdlib"]``).
Passages are 600 to 2,600 characters (about 150 to 650 tokens), so an answer can copy from them.
The sets therefore depend on the Python version (its stdlib and reference) and, for licence
passages, on the machine having ``/usr/share/common-licenses``.

**Split.** Every prompt has a template (a named instruction phrasing, conversation or problem
generator of :mod:`dynatree.bench.instruct_text`) and at most one source document (``pydoc/<topic>``,
``licence/<file>``, ``stdlib/<module>``). A prompt is held out when its template *and* its
document are held out (:func:`template_held_out`, :func:`dynatree.text.corpora.is_held_out`), training
when both are not; a held-out document only ever gets held-out templates and vice versa. So the
bench's held-out prompts share neither an instruction phrasing nor a source text with a draft
trained on the training part (:func:`instruct_messages` with ``held_out=False``).

**Determinism.** The content is fixed by :data:`SEED` and the sources; the bench's ``--seed`` only
reorders which prompts come first. Prompts are rendered through the tokenizer's chat template
(:func:`dynatree.integrations.chat.chat_prompt`), so their ids are what ``dynatree chat`` and
``generate --chat`` would feed the model.
"""

from __future__ import annotations

import ast
import functools
import random
import re
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dynatree.text import corpora, python_source
from dynatree.text.prose import (blocks_of, is_heading_block, is_prose_block, is_wrapped_prose, passages, quotable,
                                 sentences)
from dynatree.text.templates import fits, render
from dynatree.errors import DynaTreeError
from dynatree.bench import instruct_text
from dynatree.bench.instruct_text import Template

CATEGORIES = ("chat", "summarize", "qa", "rewrite", "code", "math")  # Spec-Bench's column order
PREFIX = "instruct"
SETS: dict[str, tuple[str, ...]] = {f"{PREFIX}-{c}": (c,) for c in CATEGORIES} | {PREFIX: CATEGORIES}
SEED = 2024  # fixes every random choice of the content (passage cuts, template picks, numbers)
TEMPLATE_HOLDOUT_EVERY = 3  # one template in three is held out (documents: corpora.HOLDOUT_EVERY)
MIN_PASSAGE_CHARS, MAX_PASSAGE_CHARS = 600, 2600  # ~150 to ~650 tokens: long enough to copy from
TARGET_PASSAGE_CHARS = (800, 2200)  # each passage aims at a length drawn from this range
MIN_CODE_CHARS, MAX_CODE_CHARS, MAX_CODE_LINES = 500, 2200, 70
FUNCTIONS_PER_MODULE = 4  # spreads the code prompts over many modules
MATH_PER_TEMPLATE = 24
MIN_DOCSTRING_WORDS = 60  # shorter module docstrings are a line of description, not a passage

Messages = list[dict[str, str]]


@dataclass(frozen=True)
class Example:
    """One prompt before tokenization: its messages (ending with a user turn) and what decides its
    split -- the template's name and the source document's name (None: no document)."""

    category: str
    template: str
    source: str | None
    messages: tuple[tuple[str, str], ...]  # (role, content), hashable so examples can be deduplicated

    def as_messages(self) -> Messages:
        return [{"role": role, "content": content} for role, content in self.messages]


def template_held_out(name: str) -> bool:
    """Whether a template is held out: by a hash of its name (like documents), so a template keeps
    its side when others are added."""
    return corpora.is_held_out(name, TEMPLATE_HOLDOUT_EVERY)


def _check_category(category: str) -> str:
    if category not in CATEGORIES:
        raise DynaTreeError(f"unknown instruct category '{category}': use one of {', '.join(CATEGORIES)}")
    return category


# ------------------------------------------------------------------------------------ passages
@dataclass(frozen=True)
class _Doc:
    """A source document as blocks: prose paragraphs on one line, code blocks verbatim, headings."""

    name: str
    source: str  # where it comes from, in words (for templates that say so)
    blocks: tuple[str, ...]


_is_heading, _is_prose = is_heading_block, is_prose_block


def _blocks(text: str) -> list[str]:
    """A document's blocks: prose joined onto one line only where it passes the strict test (code,
    tables, diagrams and licence headers keep their lines), cut to the passage target."""
    return blocks_of(text, TARGET_PASSAGE_CHARS[1], is_wrapped_prose)


@functools.lru_cache(maxsize=1)
def _stdlib_modules() -> tuple[tuple[str, str], ...]:
    """(module name, source) of the top-level modules of the standard library, by name; the
    private ``__hello__``-style modules are left out."""
    out = []
    for path in sorted(python_source.stdlib_root().glob("*.py")):
        if path.stem.startswith("__") or path.stem in ("this", "antigravity"):
            continue
        try:
            out.append((path.stem, path.read_text(encoding="utf-8")))
        except (OSError, UnicodeDecodeError):
            continue
    return tuple(out)


@functools.lru_cache(maxsize=1)
def _stdlib_trees() -> tuple[tuple[str, str, ast.Module], ...]:
    out = []
    for name, source in _stdlib_modules():
        try:
            out.append((name, source, ast.parse(source)))
        except (SyntaxError, ValueError):
            continue
    return tuple(out)


@functools.lru_cache(maxsize=1)
def _prose_docs() -> tuple[_Doc, ...]:
    """Every document passages are cut from: pydoc topics, the newest version of each licence
    family (versions share most text, a second one would only repeat passages), module docstrings."""
    docs = [_Doc(t.name, "the Python language reference", tuple(_blocks(t.text)))
            for t in sorted(corpora.pydoc_texts(), key=lambda t: t.name)]
    for family, text in corpora.newest_licences():
        docs.append(_Doc(text.name, f"the {family.split('/')[-1]} licence text", tuple(_blocks(text.text))))
    for module, _, tree in _stdlib_trees():
        doc = ast.get_docstring(tree)
        if doc and len(doc.split()) >= MIN_DOCSTRING_WORDS:
            docs.append(_Doc(f"stdlib/{module}", f"the documentation of Python's `{module}` module",
                             tuple(_blocks(doc))))
    return tuple(_without_held_out_text([d for d in docs if d.blocks]))


def _without_held_out_text(docs: list[_Doc]) -> list[_Doc]:
    """Training documents cut around every paragraph a held-out document also has.

    Split by name alone would leak: pydoc topics repeat one another (the ``naming`` topic holds
    the whole of ``dynamic-features``), so a held-out passage could reach training through
    another topic. The cut leaves pieces of the training document; passages never span a cut.
    """
    held = {b for d in docs if corpora.is_held_out(d.name) for b in d.blocks if not _is_heading(b)}
    out = []
    for doc in docs:
        if corpora.is_held_out(doc.name) or not held.intersection(doc.blocks):
            out.append(doc)
            continue
        piece: list[str] = []
        for block in (*doc.blocks, None):
            if block is None or block in held:
                if piece:
                    out.append(_Doc(doc.name, doc.source, tuple(piece)))
                piece = []
            else:
                piece.append(block)
    return out


def _passages(doc: _Doc, rng: random.Random) -> Iterator[tuple[str, ...]]:
    return passages(doc.blocks, rng, TARGET_PASSAGE_CHARS, MIN_PASSAGE_CHARS, MAX_PASSAGE_CHARS)


_STOP = frozenset("""
about above after again against also although among another because been before being below between
both cannot could does doing during each either every first following from further given have having
here however into itself just least less like made make many might more most much must need neither
never none only other otherwise over same several shall should since some such than that their them
themselves then there these they this those though through thus under until upon used using very
were what when where whether which while will with within without would your yours example section
following described instead above below case cases note""".split())
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*(?:\(\))?")
_COND = re.compile(r"(?:^|[.;:]\s+|,\s+)(If|if|When|when)\s+([^,.;:!?()]{12,110}),\s")


def _passage_fields(doc: _Doc, blocks: Sequence[str]) -> dict[str, Any]:
    """What templates may ask of a passage; a field is None when the passage has no good value."""
    prose = [b for b in blocks if _is_prose(b)]
    passage = "\n\n".join(blocks)
    first = quotable(sentences(prose[0])[0]) if prose else None
    last = quotable(sentences(prose[-1])[-1]) if prose else None
    words = Counter(w for w in _WORD.findall(passage) if len(w) >= 5 and w.lower() not in _STOP)
    # identifiers (str.split(), max_length) say more about a passage than its commonest words
    scored = sorted(words.items(), key=lambda kv: -kv[1] * (3 if re.search(r"[._()]", kv[0]) else 1))
    term, count = next(((w, n) for w, n in scored if n >= 2), (None, None))
    cond = next((m for b in prose for m in _COND.finditer(b)), None)
    n_words = len(passage.split())
    return {
        "passage": passage, "first": first, "last": last, "source": doc.source,
        "paragraphs": sum(1 for b in blocks if not _is_heading(b)), "words": max(10, round(n_words, -1)),
        "term": term, "term_count": count,
        "cond_word": cond.group(1).lower() if cond else None, "cond": cond.group(2).strip() if cond else None,
    }


# ----------------------------------------------------------------------------------- functions
_RENAMES = {"i": "index", "j": "inner_index", "k": "key", "v": "value", "n": "count", "s": "text",
            "f": "file_obj", "x": "item", "c": "char", "p": "part", "d": "mapping", "l": "items",
            "res": "result", "ret": "return_value", "tmp": "temp_value", "buf": "buffer", "msg": "message"}


def _functions(module: str, source: str, tree: ast.Module) -> list[dict[str, Any]]:
    """Functions and methods of a module whose source is a copyable size, with their fields."""
    return [{**f.fields(), "module": module,
             "formatting": True if re.search(r"""['"]\s*%\s*[\w(]|\.format\(""", f.code) else None}
            for f in python_source.functions(source, tree, MIN_CODE_CHARS, MAX_CODE_CHARS, MAX_CODE_LINES, _RENAMES)]


# ------------------------------------------------------------------------------------ building
def _pick(templates: Sequence[Template], fields: dict[str, Any], held_out: bool,
          rng: random.Random) -> Template | None:
    """A template of the same side of the split as the source that the source can fill."""
    usable = [t for t in templates if template_held_out(t.name) == held_out and fits(t, fields)]
    return rng.choice(usable) if usable else None


def _from_sources(category: str, templates: Sequence[Template],
                  sources: Sequence[tuple[str, dict[str, Any]]]) -> list[Example]:
    """One example per source: each gets a template from its own side of the split."""
    out = []
    for name, fields in sources:
        rng = random.Random(f"{SEED}/{category}/{name}/{fields.get('passage', fields.get('code'))[:64]}")
        held = corpora.is_held_out(name)
        template = _pick(templates, fields, held, rng)
        if template is not None:
            out.append(Example(category, template.name, name, render(template, fields)))
    return out


def _passage_sources(category: str) -> list[tuple[str, dict[str, Any]]]:
    """Every passage of every prose document with its fields; cut anew for each category (its own
    random lengths), so two categories rarely show the very same passage."""
    out = []
    for doc in _prose_docs():
        rng = random.Random(f"{SEED}/{category}/{doc.name}/{doc.blocks[0][:64]}")  # a document may come in pieces
        out += [(doc.name, _passage_fields(doc, blocks)) for blocks in _passages(doc, rng)]
    return out


def _code_sources() -> list[tuple[str, dict[str, Any]]]:
    """Up to :data:`FUNCTIONS_PER_MODULE` functions of each module. A training function that
    repeats a piece of a held-out module's function is left out: modules have twins (``profile``
    and ``cProfile`` share most of ``main``), and a split by module name alone would leak them."""
    functions_of = {module: _functions(module, source, tree) for module, source, tree in _stdlib_trees()}
    held = {chunk for module, fs in functions_of.items() if corpora.is_held_out(f"stdlib/{module}")
            for f in fs for chunk in f["code"].split("\n\n") if len(chunk.strip()) >= 60}
    out = []
    for module, functions in functions_of.items():
        if not corpora.is_held_out(f"stdlib/{module}"):
            functions = [f for f in functions if not any(chunk in f["code"] for chunk in held)]
        rng = random.Random(f"{SEED}/code/{module}")
        chosen = sorted(rng.sample(range(len(functions)), min(FUNCTIONS_PER_MODULE, len(functions))))
        out += [(f"stdlib/{module}", functions[i]) for i in chosen]
    return out


def _math_examples() -> list[Example]:
    out = []
    for template in instruct_text.MATH:
        rng = random.Random(f"{SEED}/{template.name}")
        problems = list(dict.fromkeys(template.make(rng) for _ in range(MATH_PER_TEMPLATE * 3)))
        out += [Example("math", template.name, None, (("user", p),)) for p in problems[:MATH_PER_TEMPLATE]]
    return out


def _talk_examples() -> list[Example]:
    return [Example("chat", t.name, None, render(t, {})) for t in instruct_text.CHAT_TALKS]


@functools.lru_cache(maxsize=None)
def _examples(category: str) -> tuple[Example, ...]:
    """Every example of a category, both sides of the split, duplicates removed, in build order."""
    if category == "math":
        built = _math_examples()
    elif category == "code":
        built = _from_sources("code", instruct_text.CODE, _code_sources())
    else:
        templates = {"summarize": instruct_text.SUMMARIZE, "rewrite": instruct_text.REWRITE,
                     "qa": instruct_text.QA, "chat": instruct_text.CHAT_PASSAGE}[category]
        built = _from_sources(category, templates, _passage_sources(category))
        if category == "chat":
            built += _talk_examples()
    return tuple(dict.fromkeys(built))


def is_held_out(example: Example) -> bool | None:
    """True / False for a held-out / training example, None if its template and document are on
    different sides (never built, but checked rather than assumed)."""
    template = template_held_out(example.template)
    if example.source is None or corpora.is_held_out(example.source) == template:
        return template
    return None


def instruct_examples(category: str, *, held_out: bool = True, seed: int = 0) -> list[Example]:
    """The examples of one side of the split, in an order that spreads over sources: sources
    (documents, or templates where there is none) shuffled by :data:`SEED` + ``seed`` and the
    category, then taken round-robin; ``seed`` changes the order, never the content."""
    _check_category(category)
    by_source: dict[str, list[Example]] = {}
    for e in _examples(category):
        if is_held_out(e) == held_out:
            by_source.setdefault(e.source or e.template, []).append(e)
    groups = list(by_source.values())
    random.Random(f"{SEED + seed}/{category}").shuffle(groups)
    out: list[Example] = []
    for i in range(max(map(len, groups), default=0)):
        out += [g[i] for g in groups if i < len(g)]
    return out


def instruct_messages(category: str, *, held_out: bool = True) -> list[Messages]:
    """The conversations of one category and side of the split (each ends with a user turn), for
    training data or any other use that renders them itself; the training side
    (``held_out=False``) never shares a template or a source document with the bench's prompts."""
    return [e.as_messages() for e in instruct_examples(category, held_out=held_out)]


# ------------------------------------------------------------------------------------ prompt ids
def _render_ids(tokenizer: Any, example: Example) -> list[int]:
    from dynatree.integrations.chat import chat_prompt  # imports torch: only when prompts are tokenized

    return chat_prompt(tokenizer, example.as_messages())


def instruct_prompts(category: str, tokenizer: Any, *, held_out: bool = True, n: int | None = None,
                     max_prompt_tokens: int | None = None, seed: int = 0) -> list[list[int]]:
    """Prompt ids of one category through ``tokenizer``'s chat template (with the generation
    prompt): the first ``n`` (default: all) of at most ``max_prompt_tokens`` tokens. Longer prompts
    are skipped, not cut: a cut passage would end mid-sentence and lose the instruction after it.
    ``seed`` only reorders the prompts (the content is fixed)."""
    return [ids for _, ids in _pairs((_check_category(category),), tokenizer, held_out, n, max_prompt_tokens,
                                     seed, label=category)]


def _capped(category: str, tokenizer: Any, held_out: bool, max_prompt_tokens: int | None,
            seed: int) -> Iterator[tuple[str, list[int]]]:
    """A category's prompts in ``seed`` order, rendered lazily, those over the cap skipped."""
    for example in instruct_examples(category, held_out=held_out, seed=seed):
        ids = _render_ids(tokenizer, example)
        if max_prompt_tokens is None or len(ids) <= max_prompt_tokens:
            yield category, ids


def _pairs(categories: Sequence[str], tokenizer: Any, held_out: bool, n: int | None,
           max_prompt_tokens: int | None, seed: int, label: str) -> list[tuple[str, list[int]]]:
    """(category, ids), round-robin over ``categories``; fewer than ``n`` is an error rather than a
    silently smaller benchmark."""
    if (n is not None and n < 1) or (max_prompt_tokens is not None and max_prompt_tokens < 1):
        raise DynaTreeError("n and max_prompt_tokens must be at least 1")
    streams = [_capped(c, tokenizer, held_out, max_prompt_tokens, seed) for c in categories]
    out: list[tuple[str, list[int]]] = []
    while streams and (n is None or len(out) < n):
        alive = []
        for stream in streams:
            if n is not None and len(out) >= n:
                break
            item = next(stream, None)
            if item is not None:
                alive.append(stream)
                out.append(item)
        streams = alive
    if n is not None and len(out) < n:
        cap = f" of at most {max_prompt_tokens} tokens (try --max-prompt-tokens 1024)" if max_prompt_tokens else ""
        raise DynaTreeError(f"'{label}' has only {len(out)} held-out prompts{cap}, {n} requested"
                            if held_out else f"'{label}' has only {len(out)} training prompts{cap}, {n} requested")
    return out


def is_instruct_set(name: str) -> bool:
    return name in SETS


def instruct_set(name: str, tokenizer: Any, num_prompts: int, max_prompt_tokens: int | None,
                 seed: int = 0) -> list[tuple[str, list[int]]]:
    """The bench's view of a named set (``instruct-<category>`` or ``instruct`` = all six,
    round-robin): (category, ids) of ``num_prompts`` held-out prompts, ``seed`` reordering them."""
    if name not in SETS:
        raise DynaTreeError(f"unknown instruct set '{name}': use one of {', '.join(SETS)}")
    return _pairs(SETS[name], tokenizer, True, num_prompts, max_prompt_tokens, seed, label=name)


def instruct_texts(name: str, tokenizer: Any, num_prompts: int, max_prompt_tokens: int | None,
                   seed: int = 0) -> list[str]:
    """The prompts of :func:`instruct_set` as text (the chat template's rendering, special tokens
    included), for callers that want strings."""
    return [tokenizer.decode(ids) for _, ids in instruct_set(name, tokenizer, num_prompts, max_prompt_tokens, seed)]


def row_category(row: Mapping[str, Any]) -> str | None:
    """The instruct category a bench row measured: from its dataset (``instruct-code``), or for
    the mixed set from the prompt id, which the bench writes as ``instruct:<seed>:<i>:<category>``."""
    dataset = str((row.get("settings") or {}).get("dataset"))
    categories = SETS.get(dataset)
    if categories is None:
        return None
    if len(categories) == 1:
        return categories[0]
    tail = str(row.get("prompt_id", "")).rsplit(":", 1)[-1]
    return tail if tail in categories else None
