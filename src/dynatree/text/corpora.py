"""The text sources of the bench prompt sets and of draft distillation, all without the HF hub.

Every text source of the bench prompt sets and of draft distillation is a list of :class:`Text`
documents with a stable ``name`` that decides the train/held-out split (:func:`is_held_out`), so a
held-out document never reaches training; :mod:`dynatree.text.prose` decides which paragraphs each job
keeps. Two sources are on every machine: the Python language reference (:func:`pydoc_texts`) and
Debian's licence texts (:func:`licence_texts`). Two are fetched from package registries:

* ``wiki`` — 106 English Wikipedia articles (Anarchism, Autism, Alabama, Abraham Lincoln,
  Aristotle, ...) from a 2017 dump that PyPI's ``gensim`` 4.4.0 wheel carries as test data. Wiki
  markup is removed with ``mwparserfromhell``; reference sections are dropped. About 3.4 M
  characters. Text: Wikipedia contributors, CC BY-SA 3.0.
* ``books`` — the six Jane Austen novels of Debian's ``r-cran-janeaustenr`` and *Moby Dick* of
  Debian's ``r-cran-tokenizers`` (Project Gutenberg texts, public domain), stored in R's lazy-load
  ``.rdb`` format: an index (``.rdx``, gzip'd R serialisation of name -> (offset, length)) and,
  per object, a 4-byte big-endian length followed by a zlib stream of an R character vector,
  parsed with ``rdata``. One document per chapter, about 5 M characters.

Sources are fetched on first use with the registries' ordinary clients (``pip download``,
``apt-get download``), checked against the SHA-256 of the file we read (a registry may serve a
different wheel for another platform, but the member inside is the same), and cached under
``$DYNATREE_CACHE/corpora`` with a ``provenance.json`` recording where each came from.
"""

from __future__ import annotations

import bz2
import gzip
import hashlib
import json
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import zipfile
import zlib
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from dynatree.errors import DynaTreeError


@dataclass(frozen=True)
class Text:
    """One document: ``name`` is stable across runs and decides its split; ``text`` is paragraphs
    separated by blank lines."""

    name: str
    text: str


@dataclass(frozen=True)
class Source:
    """A file inside a registry package, and what we know about it."""

    registry: str  # "pypi" or "debian"
    package: str
    version: str
    member: str  # path of the file inside the wheel / .deb
    sha256: str  # of the member, so the check does not depend on the platform's wheel
    licence: str
    attribution: str


SOURCES: dict[str, Source] = {
    "wiki": Source(
        "pypi", "gensim", "4.4.0",
        "gensim/test/test_data/enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2",
        "a53f4648dec40467ebdcbc7a1307eddb51fe6e28e9309f6ebde81ba0d04bea2d",
        "CC BY-SA 3.0", "Wikipedia contributors, English Wikipedia (2017 dump, 106 articles)"),
    "austen": Source(
        "debian", "r-cran-janeaustenr", "1.0.0-1",
        "usr/lib/R/site-library/janeaustenr/data/Rdata.rdb",
        "8fb5198960d0da724b1562f96e4221e5c1b41ff455000280b02c55980c3d8f21",
        "public domain", "Jane Austen's six novels (Project Gutenberg), via the R package janeaustenr"),
    "austen-index": Source(
        "debian", "r-cran-janeaustenr", "1.0.0-1",
        "usr/lib/R/site-library/janeaustenr/data/Rdata.rdx",
        "cab8cbe4ce965d3b42b35c03383bafccc0eb78151f70e4748ead45270470c22f",
        "public domain", "index of the janeaustenr data"),
    "mobydick": Source(
        "debian", "r-cran-tokenizers", "0.3.0-1",
        "usr/lib/R/site-library/tokenizers/data/Rdata.rdb",
        "2a7581d1d9c2f49fd8c8493e556f984f4a5cdc071eeb6248b0fa719be6b088fe",
        "public domain", "Herman Melville, Moby Dick (Project Gutenberg), via the R package tokenizers"),
    "mobydick-index": Source(
        "debian", "r-cran-tokenizers", "0.3.0-1",
        "usr/lib/R/site-library/tokenizers/data/Rdata.rdx",
        "597c9d0f30a6fd0f70a87130d5b424e6cf690894efd8ac283e75cd44d58847cd",
        "public domain", "index of the tokenizers data"),
}

CORPORA = ("wiki", "books")
HOLDOUT_EVERY = 8  # one document in eight is held out (evaluation and bench prompts only)
_DROP_SECTIONS = re.compile(
    r"^(references|external links|see also|notes|further reading|bibliography|sources|"
    r"citations|footnotes|notes and references)$", re.I)


# ---------------------------------------------------------------------------- split
def family_of(name: str) -> str:
    """A document's name without a trailing version suffix (``licence/GPL-3`` -> ``licence/GPL``):
    the versions of one licence share most of their text, so they go together."""
    return re.sub(r"-[\d.]+$", "", name)


def is_held_out(name: str, holdout_every: int = HOLDOUT_EVERY) -> bool:
    """Deterministic document-level split (stable across Python runs, unlike ``hash``).

    Versions of one licence (GPL-2/GPL-3, GFDL-1.2/1.3, ...) share most of their text, so the
    split is by family (a trailing version suffix is stripped): held-out text never reaches
    training.
    """
    return int(hashlib.sha256(family_of(name).encode()).hexdigest(), 16) % holdout_every == 0


def split(texts: list[Text], held_out: bool, holdout_every: int = HOLDOUT_EVERY) -> list[Text]:
    """The held-out (``True``) or training (``False``) part of ``texts``."""
    return [t for t in texts if is_held_out(t.name, holdout_every) == held_out]


# ---------------------------------------------------------------------------- fetching
def corpora_dir() -> Path:
    from dynatree.loading.gguf import cache_dir  # gguf imports nothing from here: no cycle

    return cache_dir() / "corpora"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _run(cmd: list[str], cwd: Path, what: str) -> None:
    try:
        subprocess.run(cmd, cwd=cwd, check=True, capture_output=True, text=True, timeout=600)
    except FileNotFoundError:
        raise DynaTreeError(f"cannot fetch {what}: `{cmd[0]}` is not installed") from None
    except subprocess.CalledProcessError as exc:
        last = (exc.stderr or exc.stdout or "").strip().splitlines()[-1:] or ["no output"]
        raise DynaTreeError(f"cannot fetch {what} (`{' '.join(cmd)}` failed: {last[0]})") from None
    except subprocess.TimeoutExpired:
        raise DynaTreeError(f"cannot fetch {what}: `{' '.join(cmd)}` timed out") from None


def _download(source: Source, tmp: Path) -> Path:
    """Fetch the package archive into ``tmp`` with the registry's own client; return its path."""
    what = f"{source.package} {source.version} from {source.registry}"
    if source.registry == "pypi":
        _run([sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
              "-q", "-d", str(tmp), f"{source.package}=={source.version}"], tmp, what)
        found = sorted(tmp.glob(f"{source.package}-*"))
    elif source.registry == "debian":
        if shutil.which("apt-get") is None:
            raise DynaTreeError(f"cannot fetch {what}: this system has no apt-get (Debian's package "
                                "client); the 'books' corpus comes from Debian packages")
        _run(["apt-get", "download", source.package], tmp, what)
        found = sorted(tmp.glob(f"{source.package}_*.deb"))
    else:
        raise DynaTreeError(f"unknown registry {source.registry!r}")
    if not found:
        raise DynaTreeError(f"cannot fetch {what}: the client reported success but left no file")
    return found[0]


def _extract(archive: Path, member: str, dest: Path) -> None:
    if archive.suffix == ".deb":
        out = archive.parent / "deb"
        _run(["dpkg-deb", "-x", str(archive), str(out)], archive.parent, archive.name)
        shutil.copyfile(out / member, dest)
    else:
        with zipfile.ZipFile(archive) as zf, zf.open(member) as src, open(dest, "wb") as dst:
            shutil.copyfileobj(src, dst)


def fetch(key: str, root: Path | None = None,
          download: Callable[[Source, Path], Path] = _download) -> Path:
    """The cached file of ``SOURCES[key]``, fetched and checked on first use.

    ``download`` is injectable so tests can serve a local archive instead of a registry.
    """
    source = SOURCES[key]
    root = root if root is not None else corpora_dir()
    dest = root / key / Path(source.member).name
    if dest.is_file():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
        archive = download(source, Path(tmp))
        part = Path(tmp) / dest.name
        try:
            _extract(archive, source.member, part)
        except (KeyError, FileNotFoundError):
            raise DynaTreeError(f"{archive.name} has no {source.member}: the package changed; "
                                "update dynatree.text.corpora.SOURCES") from None
        digest = _sha256(part)
        if source.sha256 and digest != source.sha256:
            raise DynaTreeError(f"{source.member} from {archive.name} has SHA-256 {digest[:12]}..., "
                                f"expected {source.sha256[:12]}...: refusing a changed corpus")
        record = {**asdict(source), "archive": archive.name, "archive_sha256": _sha256(archive),
                  "member_sha256": digest}
        (dest.parent / "provenance.json").write_text(json.dumps(record, indent=1))
        part.replace(dest)
    return dest


# ---------------------------------------------------------------------------- on every machine
LICENCES_DIR = Path("/usr/share/common-licenses")


def pydoc_texts() -> list[Text]:
    """The raw topics of the Python language reference shipped inside CPython (``pydoc_data``, the
    text ``help()`` shows), in its own order; :mod:`dynatree.text.prose` keeps their prose."""
    from pydoc_data.topics import topics

    return [Text(f"pydoc/{name}", text) for name, text in topics.items()]


def licence_texts(directory: Path = LICENCES_DIR) -> list[Text]:
    """Each distinct licence file of ``directory`` (Debian's common-licenses) once, named
    ``licence/<file>``: a symlink such as GPL -> GPL-3 is read through its target, in the order of
    the first name that reaches it. No folder (non-Debian systems) means no documents."""
    seen: dict[Path, Text] = {}
    if directory.is_dir():
        for path in sorted(directory.iterdir()):
            real = path.resolve()
            if real not in seen and real.is_file():
                seen[real] = Text(f"licence/{real.name}", real.read_text(encoding="utf-8", errors="replace"))
    return list(seen.values())


def newest_licences(directory: Path = LICENCES_DIR) -> list[tuple[str, Text]]:
    """(family, text) of the newest version of each licence family of :func:`licence_texts`, by
    family; the newest is the last by name (GPL-2, GPL-3). Versions share most of their text, so a
    source of passages takes one: a second would only repeat passages."""
    newest: dict[str, Text] = {}
    for text in sorted(licence_texts(directory), key=lambda t: t.name):
        newest[family_of(text.name)] = text
    return sorted(newest.items())


# ---------------------------------------------------------------------------- wiki
def _wiki_sections(markup: str) -> list[tuple[str, str]]:
    """``(heading, body)`` pairs; the lead section has heading ``""``."""
    parts = re.split(r"^(={2,6})\s*(.*?)\s*\1\s*$", markup, flags=re.M)
    sections = [("", parts[0])]
    sections += [(parts[i + 1], parts[i + 2]) for i in range(1, len(parts) - 2, 3)]
    return sections


def _wiki_plain(body: str) -> str:
    """Plain paragraphs of one section: markup, tables, files and templates removed."""
    import mwparserfromhell

    body = re.sub(r"<ref[^>]*/>|<ref[^>]*>.*?</ref>", "", body, flags=re.S | re.I)  # citations
    text = mwparserfromhell.parse(body).strip_code(normalize=True, collapse=True)
    paras = []
    for block in re.split(r"\n\s*\n", text):
        lines = [ln.strip() for ln in block.splitlines()]
        lines = [ln for ln in lines if ln and not ln.startswith(("*", "#", ";", ":", "|", "{", "!"))]
        para = re.sub(r"\s+", " ", " ".join(lines)).strip()
        para = re.sub(r"\(\s*[,;]?\s*\)", "", para).replace(" ,", ",").replace(" .", ".")
        if len(para.split()) >= 12:
            paras.append(para)
    return "\n\n".join(paras)


def wiki_texts(path: Path | None = None) -> list[Text]:
    """One :class:`Text` per article (redirects and non-article pages skipped)."""
    import xml.etree.ElementTree as ET

    path = path if path is not None else fetch("wiki")
    texts = []
    with bz2.open(path) as fh:
        for _, el in ET.iterparse(fh):
            if el.tag.rsplit("}", 1)[-1] != "page":
                continue
            title, ns = el.findtext("{*}title") or "", el.findtext("{*}ns")
            markup = el.findtext("{*}revision/{*}text") or ""
            if ns == "0" and el.find("{*}redirect") is None and markup:
                body = "\n\n".join(_wiki_plain(b) for h, b in _wiki_sections(markup)
                                   if not _DROP_SECTIONS.match(h))
                body = re.sub(r"\n{3,}", "\n\n", body).strip()
                if body:
                    texts.append(Text(f"wiki/{title}", body))
            el.clear()
    return texts


# ---------------------------------------------------------------------------- books
def read_rdb(rdb: Path, rdx: Path) -> dict[str, Any]:
    """Every object of an R lazy-load database, converted by ``rdata`` (character vectors ->
    arrays of str)."""
    import warnings

    import rdata

    warnings.filterwarnings("ignore", "Unknown file type", UserWarning)  # .rdb objects carry no header
    index = rdata.conversion.convert(rdata.parser.parse_data(gzip.decompress(rdx.read_bytes())))
    blob = rdb.read_bytes()
    out = {}
    for name, (offset, length) in index["variables"].items():
        chunk = blob[int(offset):int(offset) + int(length)]
        (size,) = struct.unpack(">I", chunk[:4])
        raw = zlib.decompress(chunk[4:])
        if len(raw) != size:
            raise DynaTreeError(f"{rdb.name}: object {name} is damaged ({len(raw)} != {size} bytes)")
        out[str(name)] = rdata.conversion.convert(rdata.parser.parse_data(raw))
    return out


_CHAPTER = re.compile(r"^\s*(CHAPTER|Chapter)\s+([0-9IVXLC]+)\b.*$", re.M)


def _chapters(book: str, text: str) -> list[Text]:
    """Split a book's text at its chapter headings; front matter before chapter 1 is dropped."""
    text = text.replace("\r\n", "\n")
    text = re.split(r"\*\*\* END OF|End of (the )?Project Gutenberg", text, maxsplit=1)[0]
    text = re.sub(r"_([^_\n]+)_", r"\1", text)  # _italics_
    marks = list(_CHAPTER.finditer(text))
    texts = []
    for i, m in enumerate(marks):
        body = text[m.end(): marks[i + 1].start() if i + 1 < len(marks) else len(text)]
        paras = [re.sub(r"\s+", " ", p).strip() for p in re.split(r"\n\s*\n", body)]
        paras = [p for p in paras if len(p.split()) >= 8]
        if paras:
            texts.append(Text(f"books/{book}/{i + 1}", "\n\n".join(paras)))
    return texts


def _lines_to_text(lines: Any) -> str:
    """janeaustenr stores one printed line per element, "" between paragraphs."""
    return "\n".join("" if str(line).strip() in ("", "nan", "None") else str(line) for line in lines)


def books_texts(root: Path | None = None) -> list[Text]:
    """One :class:`Text` per chapter of the six Austen novels and *Moby Dick*."""
    austen = read_rdb(fetch("austen", root), fetch("austen-index", root))
    moby = read_rdb(fetch("mobydick", root), fetch("mobydick-index", root))
    texts = []
    for name in sorted(austen):
        texts += _chapters(name, _lines_to_text(austen[name]))
    for name in sorted(moby):  # a single string holding the whole book
        texts += _chapters(name, "\n".join(str(x) for x in moby[name]))
    return texts


CLEANING_VERSION = 1  # bump when the cleaning changes: cached documents are rebuilt


def load(name: str, root: Path | None = None) -> list[Text]:
    """All documents of a corpus of :data:`CORPORA` (train and held-out; see :func:`split`).

    The cleaned documents are cached next to the fetched files (cleaning the wiki dump takes
    tens of seconds), keyed by :data:`CLEANING_VERSION`.
    """
    builders: dict[str, Callable[[], list[Text]]] = {
        "wiki": lambda: wiki_texts(fetch("wiki", root)), "books": lambda: books_texts(root)}
    if name not in builders:
        raise DynaTreeError(f"unknown corpus {name!r}: use one of {', '.join(CORPORA)}")
    cached = (root if root is not None else corpora_dir()) / f"{name}.v{CLEANING_VERSION}.json"
    if cached.is_file():
        return [Text(**t) for t in json.loads(cached.read_text(encoding="utf-8"))]
    texts = builders[name]()
    cached.parent.mkdir(parents=True, exist_ok=True)
    part = cached.with_suffix(".part")
    part.write_text(json.dumps([asdict(t) for t in texts]), encoding="utf-8")
    part.replace(cached)
    return texts
