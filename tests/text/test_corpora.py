"""Offline corpora: wiki markup cleaning, R lazy-load parsing, chapter split, fetching and checks.

Every fixture is built in-process (a 2-page wiki dump, an R database written with ``rdata``, a
wheel zip): no registry is contacted. The real sources are fetched by the bench and distillation.
"""

from __future__ import annotations

import bz2
import dataclasses
import gzip
import struct
import zipfile
import zlib
from pathlib import Path
from xml.sax.saxutils import escape

import numpy as np
import pytest

from dynatree.text import corpora
from dynatree.text.corpora import Source, Text
from dynatree.errors import DynaTreeError

# Only the tests that parse wiki markup or R data need these optional packages (the 'offline'
# extra); a missing one skips those tests, named, and the rest still run.
@pytest.fixture
def mwparser() -> None:
    pytest.importorskip("mwparserfromhell")


@pytest.fixture
def rdata():  # noqa: ANN201 -- the module
    return pytest.importorskip("rdata")


LONG = "word " * 14
ALPHA = f"""'''Alpha''' is a [[letter|Greek letter]] used
widely in {LONG} and elsewhere.<ref>Some citation that must go.</ref> {{{{Infobox|x=1}}}}

== History ==
It was written by [[Scribe]]s in {LONG} ancient times for many years.

== References ==
Reference prose that should be dropped because it sits in a reference section {LONG}.
"""
WIKI_XML = f"""<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.10/">
<page><title>Alpha</title><ns>0</ns><revision><text>{escape(ALPHA)}</text></revision></page>
<page><title>Beta</title><ns>0</ns><redirect title="Alpha" /><revision><text>#REDIRECT [[Alpha]]</text></revision></page>
<page><title>Talk:Alpha</title><ns>1</ns><revision><text>Talk page text {LONG}.</text></revision></page>
</mediawiki>"""


def _wiki_dump(path: Path) -> Path:
    path.write_bytes(bz2.compress(WIKI_XML.encode()))
    return path


def test_wiki_texts_strip_markup_references_redirects_and_other_namespaces(tmp_path: Path, mwparser: None) -> None:
    texts = corpora.wiki_texts(_wiki_dump(tmp_path / "dump.xml.bz2"))
    assert [t.name for t in texts] == ["wiki/Alpha"]
    body = texts[0].text
    assert body.startswith("Alpha is a Greek letter used")
    assert "It was written by Scribes in" in body
    for gone in ("[[", "'''", "citation", "Infobox", "Reference prose", "History"):
        assert gone not in body
    assert body.count("\n\n") == 1  # two paragraphs: lead and History


def _rds(obj: object, tmp: Path) -> bytes:
    """R's XDR serialisation of ``obj`` (uncompressed), as ``rdata`` writes it."""
    rdata = pytest.importorskip("rdata")
    rdata.write_rds(tmp / "x.rds", obj, compression=None)
    return (tmp / "x.rds").read_bytes()


def _rdb(tmp: Path, objects: dict[str, np.ndarray]) -> tuple[Path, Path]:
    """An R lazy-load database: per object a 4-byte big-endian length + zlib stream; a gzip index."""
    blob, index = b"", {}
    for name, value in objects.items():
        raw = _rds(value, tmp)
        chunk = struct.pack(">I", len(raw)) + zlib.compress(raw)
        index[name] = np.array([len(blob), len(chunk)], dtype=np.int32)
        blob += chunk
    (tmp / "Rdata.rdb").write_bytes(blob)
    meta = {"variables": index, "references": {}, "compressed": np.array([True])}
    (tmp / "Rdata.rdx").write_bytes(gzip.compress(_rds(meta, tmp)))
    return tmp / "Rdata.rdb", tmp / "Rdata.rdx"


def test_read_rdb_returns_every_object(tmp_path: Path, rdata: object) -> None:
    lines = np.array(["EMMA", "", "CHAPTER I", "", "Emma was _clever_ and rich and lived", "happily.", ""])
    rdb, rdx = _rdb(tmp_path, {"emma": lines, "other": np.array(["x"])})
    out = corpora.read_rdb(rdb, rdx)
    assert sorted(out) == ["emma", "other"]
    assert list(out["emma"]) == list(lines)


def test_read_rdb_refuses_a_damaged_object(tmp_path: Path, rdata: object) -> None:
    rdb, rdx = _rdb(tmp_path, {"emma": np.array(["a", "b"])})
    blob = bytearray(rdb.read_bytes())
    blob[0:4] = struct.pack(">I", 3)  # declared length no longer matches the stream
    rdb.write_bytes(bytes(blob))
    with pytest.raises(DynaTreeError, match="damaged"):
        corpora.read_rdb(rdb, rdx)


def test_chapters_split_at_headings_drop_front_matter_licence_and_italics() -> None:
    words = "and then she walked along the shore of the sea"
    book = (f"Title page\r\n\r\nCHAPTER 1. Loomings.\r\nCHAPTER 2. The Carpet-Bag.\r\n\r\n"  # contents
            f"CHAPTER 1. Loomings.\r\n\r\nCall me _Ishmael_ {words}.\r\n\r\n"
            f"CHAPTER 2. The Carpet-Bag.\r\n\r\nI stuffed a shirt {words}.\r\n\r\n"
            f"End of Project Gutenberg's Moby Dick {words}.")
    texts = corpora._chapters("moby", book)
    assert [t.text for t in texts] == [f"Call me Ishmael {words}.", f"I stuffed a shirt {words}."]
    assert len({t.name for t in texts}) == 2 and all(t.name.startswith("books/moby/") for t in texts)


def test_split_is_by_document_deterministic_and_disjoint() -> None:
    texts = [Text(f"wiki/Article {i}", "x") for i in range(200)]
    held, train = corpora.split(texts, True), corpora.split(texts, False)
    assert {t.name for t in held}.isdisjoint({t.name for t in train})
    assert len(held) + len(train) == 200 and 10 <= len(held) <= 45  # about one in eight
    assert corpora.split(texts, True) == held
    # versions of one licence go to the same side
    assert corpora.is_held_out("licence/GPL-2") == corpora.is_held_out("licence/GPL-3")


def _fake_wheel(member: str, content: bytes):
    def download(source: Source, tmp: Path) -> Path:
        wheel = tmp / f"{source.package}-0-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as zf:
            zf.writestr(member, content)
        return wheel
    return download


def test_fetch_checks_the_member_checksum_records_provenance_and_caches(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mwparser: None) -> None:
    content = bz2.compress(WIKI_XML.encode())
    source = corpora.SOURCES["wiki"]
    good = dataclasses.replace(source, sha256=corpora.hashlib.sha256(content).hexdigest())
    monkeypatch.setitem(corpora.SOURCES, "wiki", good)
    path = corpora.fetch("wiki", tmp_path, download=_fake_wheel(source.member, content))
    assert path.read_bytes() == content
    provenance = (path.parent / "provenance.json").read_text()
    assert '"package": "gensim"' in provenance and good.sha256 in provenance

    def never(source: Source, tmp: Path) -> Path:
        raise AssertionError("a cached corpus must not be fetched again")
    assert corpora.fetch("wiki", tmp_path, download=never) == path
    texts = corpora.load("wiki", tmp_path)
    assert [t.name for t in texts] == ["wiki/Alpha"]
    assert corpora.load("wiki", tmp_path) == texts  # from the cleaned cache


def test_fetch_refuses_a_changed_file_and_leaves_nothing_behind(tmp_path: Path) -> None:
    member = corpora.SOURCES["wiki"].member
    with pytest.raises(DynaTreeError, match="refusing a changed corpus"):
        corpora.fetch("wiki", tmp_path, download=_fake_wheel(member, b"not the dump"))
    assert not list((tmp_path / "wiki").glob("*.bz2"))


def test_fetch_failures_are_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(DynaTreeError, match="has no .*update dynatree.text.corpora.SOURCES"):
        corpora.fetch("wiki", tmp_path, download=_fake_wheel("other/file.bz2", b"x"))
    monkeypatch.setattr(corpora.shutil, "which", lambda name: None)
    with pytest.raises(DynaTreeError, match="no apt-get") as info:
        corpora._download(corpora.SOURCES["austen"], tmp_path)
    assert "\n" not in str(info.value)
    monkeypatch.setattr(corpora.sys, "executable", str(tmp_path / "no-such-python"))
    with pytest.raises(DynaTreeError, match="cannot fetch gensim 4.4.0 from pypi"):
        corpora._download(corpora.SOURCES["wiki"], tmp_path)
    with pytest.raises(DynaTreeError, match="unknown corpus"):
        corpora.load("nope", tmp_path)


def test_bench_offline_sets_use_only_held_out_documents(monkeypatch: pytest.MonkeyPatch) -> None:
    from dynatree.bench import datasets

    sentence = "The river runs past the old mill and through the quiet town for many miles today."
    texts = [Text(f"wiki/Article {i}", f"{sentence} {i} {sentence}") for i in range(64)]
    monkeypatch.setattr(corpora, "load", lambda name, root=None: texts)
    documents = datasets.offline_documents("wiki")
    held = {t.text for t in corpora.split(texts, True)}
    assert documents and len(documents) == len(held)
    assert {run[0] for doc in documents for run in doc} == held
