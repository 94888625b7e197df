"""What counts as prose: the paragraph filters that turn corpus text into bench prompts and
distillation data.

Every text source lives in :mod:`dynatree.text.corpora` (pydoc, licences, the offline wiki and books);
this module decides which of its paragraphs a job keeps. There are two filters, for two jobs:

* **Prompt prose** (:func:`prose_runs`, :func:`pydoc_runs`) for the bench prompt sets: complete,
  word-rich paragraphs that end a sentence and carry few code symbols -- a prompt a model
  continues as prose. A dropped paragraph ends a *run*, so a prompt never jumps over a removed
  code block (:mod:`dynatree.bench.datasets` cuts passages inside runs).
* **Training prose** (:func:`training_paragraphs`, :func:`licence_paragraphs`) for distillation:
  looser (letter-rich paragraphs of at least 80 characters, any ending), because more text means
  more labelled positions and the labels are the target's own continuations anyway.

They are different on purpose and each is pinned by what it produced: the bench's filter by the
recorded prompt sets of every benchmark result, the training filter by the shipped drafts
(``dynatree distill`` reproduces them only from the same data). Changing either means new
benchmark baselines or a retrained draft.
"""

from __future__ import annotations

import random
import re
import textwrap
from collections.abc import Callable, Iterable, Iterator, Sequence

MIN_WORDS = 20  # shorter paragraphs are headings, captions or fragments, not prose
MAX_SYMBOL_FRACTION = 0.02  # more code symbols than this marks a paragraph as code-like
MIN_TRAINING_CHARS = 80  # training prose: shorter paragraphs are headings or fragments
MIN_LICENCE_CHARS = 40  # licence paragraphs: shorter ones are headings or signatures

# A run is a list of consecutive clean paragraphs; a document is a list of runs.
Run = list[str]
Document = list[Run]

_SYMBOLS = set("=<>{}[]|\\_*#@$%^~`")
_SENTENCE_END = re.compile(r"[.!?][\"'\u2019\u201d)]*$")
_FOOTNOTE = re.compile(r"\s*\[\d+\]")
_UNDERLINE = re.compile(r"^[*=\-~^#+]{3,}$")
_BOLD = re.compile(r"\*\*(\S[^*]*?)\*\*")  # pydoc's **PEP 614**; a bare "**" operator stays
_GRAMMAR = re.compile(r"::=|^\s*[|]|>>>|^\s*\.\.\.")
#: Where a paragraph may be cut between sentences: after . ! ? (and closing quotes or brackets),
#: before a capital, a digit or an opening quote.
SENTENCE_BREAK = re.compile(r"(?<=[.!?])[\"')\]]*\s+(?=[A-Z0-9\"'(`])")
_CODE_SYMBOLS = set("=<>{}[]|\\#@$%^~()")  # not _ * ` ": prose names __aiter__ and *terms*


# ------------------------------------------------------------------------------ prompt prose
def paragraphs(text: str) -> list[str]:
    """Blocks of text separated by blank lines, with their line breaks kept."""
    return [block for block in re.split(r"\n[ \t]*\n", text) if block.strip()]


def join_lines(block: str) -> str:
    """One line with single spaces: hard wraps and double spaces after full stops are layout, not text."""
    return " ".join(block.split())


def is_prose(paragraph: str) -> bool:
    """A complete, word-rich paragraph without code symbols: something a model continues as prose."""
    if "::=" in paragraph or ">>>" in paragraph:
        return False
    if len(paragraph.split()) < MIN_WORDS or not _SENTENCE_END.search(paragraph):
        return False
    symbols = sum(char in _SYMBOLS for char in paragraph)
    return symbols <= MAX_SYMBOL_FRACTION * len(paragraph)


def runs(blocks: Iterable[str | None]) -> Document:
    """Group consecutive kept paragraphs into runs; ``None`` marks a dropped paragraph (a break)."""
    document: Document = []
    current: Run = []
    for block in blocks:
        if block is None:
            if current:
                document.append(current)
            current = []
        else:
            current.append(block)
    if current:
        document.append(current)
    return document


def pydoc_runs(text: str) -> Document:
    """Prose runs of one pydoc topic: drops indented blocks (code, grammar), headings, fragments."""

    def clean(block: str) -> str | None:
        lines = block.splitlines()
        if lines[0][:1].isspace() or any(_UNDERLINE.match(line.strip()) for line in lines):
            return None
        paragraph = _BOLD.sub(r"\1", _FOOTNOTE.sub("", join_lines(block)))
        return paragraph if is_prose(paragraph) else None

    return runs(clean(block) for block in paragraphs(text))


def prose_runs(text: str) -> Document:
    """Prose runs of plain text whose paragraphs may be indented (licences, books, articles)."""

    def clean(block: str) -> str | None:
        paragraph = join_lines(block)
        return paragraph if is_prose(paragraph) else None

    return runs(clean(block) for block in paragraphs(text))


# ---------------------------------------------------------------------------- training prose
def training_paragraphs(text: str) -> list[str]:
    """Prose paragraphs of a pydoc topic for training: no indented code or grammar blocks, no
    underlined headings, bullets and emphasis marks removed, mostly letters."""
    keep = []
    for block in re.split(r"\n\s*\n", text):
        lines = block.split("\n")
        if lines[0].startswith("   ") or any(_GRAMMAR.search(line) for line in lines):
            continue
        if re.fullmatch(r"[*=\-~^\s]+", lines[-1]):  # underlined heading
            continue
        para = " ".join(line.strip() for line in lines)
        para = re.sub(r"^\* ", "", para)
        para = re.sub(r"\*([^*\s][^*]*)\*", r"\1", para)
        letters = sum(ch.isalpha() or ch == " " for ch in para)
        if len(para) >= MIN_TRAINING_CHARS and letters >= 0.8 * len(para):
            keep.append(para)
    return keep


def licence_paragraphs(text: str) -> list[str]:
    """Paragraphs of a licence for training, each on one line; headings and signatures dropped."""
    paras = [re.sub(r"\s+", " ", p).strip() for p in re.split(r"\n\s*\n", text)]
    return [p for p in paras if len(p) >= MIN_LICENCE_CHARS]


# ------------------------------------------------------------------------------------ passages
def is_unindented(body: str) -> bool:
    """No indented line and no interpreter prompt: the training data's test for a paragraph whose
    lines are hard-wrapped prose (joined onto one line)."""
    return ">>>" not in body and not any(line[:1].isspace() for line in body.splitlines())


def is_wrapped_prose(body: str) -> bool:
    """The bench's stricter test for hard-wrapped prose rather than code, a table or a diagram:
    no indented line, no column alignment, no line starting with a symbol, few code symbols."""
    lines = body.splitlines()
    if ">>>" in body or any(line[:1].isspace() or re.search(r"\S {3,}\S", line) for line in lines):
        return False
    if any(not (line[:1].isalnum() or line[:1] in "\"'(*`") for line in lines):
        return False
    return sum(ch in _CODE_SYMBOLS for ch in body) <= 0.04 * len(body)


def blocks_of(text: str, longest: int, is_wrapped: Callable[[str], bool]) -> list[str]:
    """Paragraphs of a reference, licence, docstring or article as blocks for :func:`passages`:
    underlined headings become title lines, grammar productions are dropped, a paragraph that
    ``is_wrapped`` says is hard-wrapped prose is joined onto one line (bold marks and footnote
    references removed), any other (code, tables, diagrams, licence headers) keeps its line
    breaks, and one-line blocks over ``longest`` characters are cut at sentence ends (licences have
    4,000-character paragraphs), so every passage can start at a block.

    The instruct bench sets call it with :func:`is_wrapped_prose` and their passage target, the
    instruct training data with :func:`is_unindented` and theirs: each is pinned by what it
    produced (the recorded prompt sets, the shipped drafts' data)."""
    out = []
    for block in re.split(r"\n[ \t]*\n", text):
        if not block.strip() or "::=" in block:
            continue
        lines = [line for line in block.splitlines() if line.strip()]
        if any(_UNDERLINE.match(line.strip()) for line in lines):
            title = " ".join(line.strip() for line in lines if not _UNDERLINE.match(line.strip()))
            if title:
                out.append(title)
            continue
        body = textwrap.dedent("\n".join(lines)).rstrip()
        if is_wrapped(body):
            out.append(_BOLD.sub(r"\1", _FOOTNOTE.sub("", " ".join(body.split()))))
        else:
            out.append(body)
    return _split_long(out, longest)


def _split_long(blocks: list[str], longest: int) -> list[str]:
    """One-line blocks over ``longest`` characters in parts of about half that, cut at sentence ends."""
    out = []
    for block in blocks:
        if len(block) <= longest or "\n" in block:
            out.append(block)
            continue
        part = ""
        for sentence in SENTENCE_BREAK.split(block):
            if part and len(part) + len(sentence) > longest // 2:
                out.append(part)
                part = ""
            part = f"{part} {sentence}".strip()
        if part:
            out.append(part)
    return out


def is_heading_block(block: str) -> bool:
    """A one-line block that ends like no sentence does: a title."""
    return "\n" not in block and len(block) < 80 and not block.rstrip().endswith((".", ":", "?", "!"))


def is_prose_block(block: str) -> bool:
    """A one-line block of a dozen words or more that is not a heading."""
    return "\n" not in block and len(block.split()) >= 12 and not is_heading_block(block)


def sentences(paragraph: str) -> list[str]:
    """A one-line paragraph's sentences, cut where :data:`SENTENCE_BREAK` allows."""
    return [s.strip() for s in SENTENCE_BREAK.split(paragraph) if s.strip()]


def quotable(sentence: str) -> str | None:
    """The sentence if a request may quote it -- complete (ending with . ! or ?) and 5 to 60 words,
    neither a fragment nor a paragraph -- else None (the template field it fills has no value)."""
    return sentence if 5 <= len(sentence.split()) <= 60 and sentence.endswith((".", "!", "?")) else None


def passages(blocks: Sequence[str], rng: random.Random, target: tuple[int, int], min_chars: int,
             max_chars: int) -> Iterator[tuple[str, ...]]:
    """Non-overlapping runs of whole ``blocks``, each aiming at a length drawn from ``target``,
    never ending on a heading, holding at least one prose paragraph, ``min_chars`` to
    ``max_chars`` long. The first starts at one of the first three blocks, so callers cutting
    the same document (the bench's categories, the training set's kinds) start at different places.
    Shared by the instruct bench sets and the instruct training data, which cut passages alike."""
    start = rng.randrange(min(3, len(blocks)))
    while start < len(blocks):
        aim = rng.randint(*target)
        chosen: list[str] = []
        end, size = start, 0
        while end < len(blocks) and size < aim:
            if chosen and size + len(blocks[end]) > max_chars:
                break
            chosen.append(blocks[end])
            size += len(blocks[end]) + 2
            end += 1
        while chosen and is_heading_block(chosen[-1]):
            chosen.pop()
            end -= 1
        size = sum(len(b) + 2 for b in chosen)
        if chosen and min_chars <= size <= max_chars and any(map(is_prose_block, chosen)):
            yield tuple(chosen)
        start = max(end, start + 1)
