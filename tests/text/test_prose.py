"""The sources on every machine (pydoc, licences) and the two paragraph filters of dynatree.text.prose:
one source of text for the bench and distillation, two filters on purpose; and the helpers both
instruct builders share (the stdlib function cutter of dynatree.text.python_source, the template
filling of dynatree.text.templates)."""

from __future__ import annotations

from pathlib import Path

from dynatree.text import corpora
from dynatree.text import prose
from dynatree.bench.datasets import license_documents
from dynatree.training.data import offline_corpus

LICENCE = ("Everyone is permitted to copy and distribute verbatim copies of this license document, but "
           "changing it is not allowed, and the {} text says so in plain words.")


def _licences(tmp_path: Path) -> Path:
    """Debian's layout in small: GFDL is a link to GFDL-1.3, so the link name sorts first."""
    for name in ("GFDL-1.2", "GFDL-1.3", "Apache-2.0"):
        (tmp_path / name).write_text(f"   {name}\n\n" + LICENCE.format(name) + "\n")
    (tmp_path / "GFDL").symlink_to(tmp_path / "GFDL-1.3")
    return tmp_path


def test_licence_texts_read_each_file_once_in_the_order_of_the_first_name(tmp_path: Path) -> None:
    texts = corpora.licence_texts(_licences(tmp_path))
    assert [t.name for t in texts] == ["licence/Apache-2.0", "licence/GFDL-1.3", "licence/GFDL-1.2"]
    assert texts[1].text.startswith("   GFDL-1.3")
    assert corpora.licence_texts(tmp_path / "absent") == []


def test_newest_licences_keep_the_last_version_of_each_family(tmp_path: Path) -> None:
    newest = corpora.newest_licences(_licences(tmp_path))
    assert [(f, t.name) for f, t in newest] == [("licence/Apache", "licence/Apache-2.0"),
                                                ("licence/GFDL", "licence/GFDL-1.3")]
    assert corpora.family_of("licence/GFDL-1.2") == corpora.family_of("licence/GFDL") == "licence/GFDL"


def test_bench_and_distillation_read_the_same_licences(tmp_path: Path) -> None:
    """The bench orders them by file name (its recorded prompt sets), distillation by first name
    (the shipped drafts' data); both drop the indented heading."""
    _licences(tmp_path)
    bench = license_documents(tmp_path)
    assert bench == [[[LICENCE.format(n)]] for n in ("Apache-2.0", "GFDL-1.2", "GFDL-1.3")]
    training = [t for t in offline_corpus(tmp_path) if t.name.startswith("licence/")]
    assert [(t.name, t.text) for t in training] == [
        (f"licence/{n}", LICENCE.format(n)) for n in ("Apache-2.0", "GFDL-1.3", "GFDL-1.2")]


def test_pydoc_texts_are_the_raw_topics() -> None:
    from pydoc_data.topics import topics

    texts = corpora.pydoc_texts()
    assert [t.name for t in texts] == [f"pydoc/{k}" for k in topics]
    assert texts[0].text == next(iter(topics.values()))


def test_training_filter_keeps_what_the_prompt_filter_drops() -> None:
    """A long paragraph without a sentence end: training data (the target labels it), not a prompt."""
    fragment = ("the terms and conditions for copying distribution and modification of the program and of "
                "every work based on it follow in the sections below")
    assert prose.training_paragraphs(fragment) == [fragment]
    assert prose.prose_runs(fragment) == []
    sentence = fragment[0].upper() + fragment[1:] + "."
    assert prose.prose_runs(sentence) == [[sentence]]
    code = "   x = 1\n   y = 2 and enough words to pass every length filter of both of the two filters."
    assert prose.training_paragraphs(code) == [] and prose.pydoc_runs(code) == []


def test_a_dropped_paragraph_ends_a_run() -> None:
    a, b = (LICENCE.format(n) for n in "AB")
    assert prose.prose_runs(f"{a}\n\nshort heading\n\n{b}") == [[a], [b]]
    assert prose.prose_runs(f"{a}\n\n{b}") == [[a, b]]


def test_blocks_of_joins_by_the_callers_rule_and_cuts_long_paragraphs() -> None:
    """One block cutter, two tests for hard-wrapped prose: a column-aligned table is joined by the
    training data's rule (no indented line) but kept by the bench's stricter one."""
    text = "Title\n=====\n\nname    value\nalpha   1\n\ngrammar ::= rule\n\n    if x:\n        y = 1"
    assert prose.blocks_of(text, 1000, prose.is_unindented) == ["Title", "name value alpha 1", "if x:\n    y = 1"]
    assert prose.blocks_of(text, 1000, prose.is_wrapped_prose) == ["Title", "name    value\nalpha   1",
                                                                   "if x:\n    y = 1"]
    long = " ".join(f"Sentence number {i} is here." for i in range(20))
    parts = prose.blocks_of(long, 200, prose.is_unindented)
    assert len(parts) > 1 and " ".join(parts) == long and all(len(p) <= 200 for p in parts)


def test_functions_keep_the_callers_sizes_and_rename_by_the_callers_table() -> None:
    """One function cutter for the bench's and the training data's code requests: each passes its
    own size limits and rename table."""
    import ast

    from dynatree.text import python_source

    source = ("def tiny():\n    return 1\n\n\nclass Box:\n    @staticmethod\n    def fill(items):\n"
              "        n = 0\n        for x in items:\n            n += x\n        return n\n")
    tree = ast.parse(source)
    found = python_source.functions(source, tree, 30, 1000, 10, {"n": "count"})
    assert [(f.node.name, f.cls) for f in found] == [("fill", "Box")]
    assert found[0].code.startswith("@staticmethod\ndef fill(items):")
    assert (found[0].old, found[0].new) == ("n", "count")
    assert found[0].fields()["kind"] == "method" and found[0].fields()["comments"] is None
    assert [f.node.name for f in python_source.functions(source, tree, 1, 1000, 10, {})] == ["tiny", "fill"]
    assert python_source.functions(source, tree, 1, 1000, 5, {})[1:] == []  # fill has 6 lines
    assert python_source.functions(source, tree, 1, 1000, 10, {})[1].new == "n_value"
    assert (python_source.stdlib_root() / "ast.py").is_file()


def test_quotable_sentences_are_complete_and_of_a_quotable_length() -> None:
    text = "The first sentence is long enough to quote. Short one! Is this, the third sentence, quotable?"
    first, short, third = prose.sentences(text)
    assert prose.quotable(first) == first and prose.quotable(third) == third
    assert prose.quotable(short) is None and prose.quotable("Five words but no end") is None
    assert prose.quotable(" ".join(["word"] * 61) + ".") is None


def test_a_template_fits_a_source_with_every_field_it_shows_or_requires() -> None:
    from dynatree.bench.instruct_text import Template as BenchTemplate
    from dynatree.text import templates
    from dynatree.training.instruct_text import Template as TrainingTemplate

    for template in (BenchTemplate("t", ("Explain {term}.", "It is {what}.", "More?"), ("cond",)),
                     TrainingTemplate("t", "qa", ("Explain {term}.", "It is {what}.", "More?"), ("cond",))):
        fields = {"term": "x", "what": "y", "cond": "z"}
        assert templates.fits(template, fields)
        assert not templates.fits(template, {**fields, "cond": None})
        assert not templates.fits(template, {"term": "x", "cond": "z"})
        assert templates.render(template, fields) == (("user", "Explain x."), ("assistant", "It is y."),
                                                      ("user", "More?"))
