"""Keeping held-out text out of training, by name and by content (no torch here).

Splitting documents by name (:func:`dynatree.text.corpora.is_held_out`) is not enough: pydoc topics
repeat one another (``assignment`` holds paragraphs of the held-out ``augassign``, ``compound`` those
of ``async``), licence families share paragraphs, stdlib modules have twins. So training text is
also cut around every block that shares a :data:`SHINGLE`-character run of letters and digits with
held-out text, whatever document it sits in.

Two rules decide what is held out, and training avoids both: the training run's own
(``holdout_every``, its evaluation) and the bench's (:data:`dynatree.text.corpora.HOLDOUT_EVERY`,
the documents of the bench's held-out prompt sets), so a non-default ``holdout_every`` never moves
a bench document into training.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from dynatree.text import corpora

SHINGLE = 60  # characters of letters and digits: a shared run this long counts as shared text


def held_out_anywhere(name: str, holdout_every: int) -> bool:
    """Held out by the run's own split or by the bench's: such a document never reaches training."""
    return corpora.is_held_out(name, holdout_every) or corpora.is_held_out(name)


def _canon(text: str) -> str:
    return re.sub(r"[^0-9a-z]", "", text.lower())


class HeldOutText:
    """The text of held-out documents as hashed shingles; :meth:`shares` tells whether a piece of
    text repeats any :data:`SHINGLE`-character run of it (letters and digits, lower case)."""

    def __init__(self, texts: Iterable[str] = ()) -> None:
        self._hashes: set[int] = set()
        for text in texts:
            self.add(text)

    def add(self, text: str) -> None:
        canon = _canon(text)
        self._hashes.update(hash(canon[i:i + SHINGLE]) for i in range(len(canon) - SHINGLE + 1))

    def shares(self, text: str) -> bool:
        canon = _canon(text)
        hashes = self._hashes
        return any(hash(canon[i:i + SHINGLE]) in hashes for i in range(len(canon) - SHINGLE + 1))

    def __bool__(self) -> bool:
        return bool(self._hashes)


def pieces(blocks: Sequence[str], guard: HeldOutText) -> list[list[str]]:
    """``blocks`` cut around every block that shares text with ``guard``: the runs in between, so
    nothing cut out is ever bridged by a passage or a window."""
    out: list[list[str]] = []
    piece: list[str] = []
    for block in (*blocks, None):
        if block is None or guard.shares(block):
            if piece:
                out.append(piece)
            piece = []
        else:
            piece.append(block)
    return out
