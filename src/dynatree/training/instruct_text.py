"""The hand-written part of the instruct training data: instruction phrasings, follow-up requests,
everyday topics and the generators of arithmetic and word problems (the builder is
:mod:`dynatree.training.instruct`).

These are the *training* phrasings, written apart from the bench's (:mod:`dynatree.bench.instruct_text`):
every name starts with ``distill/``, so no template name is shared with the bench, and none of the
bench's wordings is reused. Within this file a template's name alone decides whether it is held out
of training for the draft's own evaluation (:func:`dynatree.training.instruct.template_held_out`);
renaming a template moves it across that split.

A template is a tuple of turns, user first, alternating with assistant turns, ending with a user
turn. Turns are ``str.format`` strings over the fields of a source:

* passages: ``{passage}``, ``{first}`` / ``{last}`` (first / last sentence), ``{term}`` and
  ``{term_count}`` (a word the passage repeats), ``{cond_word}`` / ``{cond}`` (an "if"/"when"
  clause), ``{source}`` (where it comes from, in words), ``{words}`` (rounded to tens);
* code: ``{code}`` (a function), ``{buggy}`` (the function with one operator changed), ``{name}``,
  ``{kind}`` ("function" or "method"), ``{module}``, ``{cls}`` (methods only), ``{old}`` / ``{new}``
  (a local variable and a new name), and the markers ``{loop}`` (it appends in a loop) and
  ``{comments}`` that exist only for code that has them;
* math: ``{problem}`` and ``{answer}`` (the generator's own result, for multi-turn talks);
* topics: ``{topic}``.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Template:
    """A named conversation skeleton: user, assistant, user, ... turns with ``str.format`` fields."""

    name: str
    kind: str  # summarize | explain | qa | rewrite | continue | code | math | chat | topic
    turns: tuple[str, ...]
    requires: tuple[str, ...] = ()  # fields the source must have though the text does not show them


def _one(kind: str, name: str, text: str, requires: tuple[str, ...] = ()) -> Template:
    return Template(f"distill/{kind}/{name}", kind, (text,), requires)


def _talk(kind: str, name: str, *turns: str) -> Template:
    return Template(f"distill/{kind}/{name}", kind, turns)


# ------------------------------------------------------------------------------------ passages
SUMMARIZE: tuple[Template, ...] = (
    _one("summarize", "brief", "Please give me a brief summary of the text below.\n\n{passage}"),
    _one("summarize", "two-sentences", "{passage}\n\nSum up the passage above in two sentences."),
    _one("summarize", "gist", "What's the gist of this?\n\n{passage}"),
    _one("summarize", "for-manager", "Summarize this excerpt from {source} for a busy manager who will "
         "only read three lines.\n\n{passage}"),
    _one("summarize", "main-ideas", "List the main ideas of the following passage, each in one short "
         "sentence.\n\n{passage}"),
    _one("summarize", "headline", "Write a headline and a short summary for this text:\n\n{passage}"),
    _one("summarize", "fifty-words", "Condense the text below into about fifty words.\n\n<text>\n{passage}\n</text>"),
    _one("summarize", "notes", "I'm taking study notes. Summarize this section as concise notes.\n\n{passage}"),
    _one("summarize", "what-is-it-about", "{passage}\n\nIn a few sentences: what is this text about?"),
    _one("summarize", "student", "Summarize the following for a high-school student.\n\n{passage}"),
    _one("summarize", "ending-first", "Read this and tell me, briefly, what it concludes and why.\n\n{passage}"),
    _one("summarize", "shorter-by-half", "Give a summary of roughly {words} words' worth of text in at most "
         "a quarter of that length:\n\n{passage}"),
)

EXPLAIN: tuple[Template, ...] = (
    _one("explain", "simple-words", "Explain this passage in simple words:\n\n{passage}"),
    _one("explain", "like-twelve", "Can you explain what this means as if I were twelve?\n\n{passage}"),
    _one("explain", "why-it-matters", "{passage}\n\nWhy does this matter? Explain the reasoning behind it."),
    _one("explain", "term", "{passage}\n\nExplain what \"{term}\" means in this text."),
    _one("explain", "example", "Read the text below and explain it with a concrete example.\n\n{passage}"),
    _one("explain", "first-sentence", "The following text starts with \"{first}\" Explain that sentence and "
         "how the rest of the text builds on it.\n\n{passage}"),
    _one("explain", "step-by-step", "Walk me through this text step by step.\n\n{passage}"),
    _one("explain", "difficult-parts", "Which parts of this passage are hardest to understand? Explain "
         "them.\n\n{passage}"),
    _one("explain", "teacher", "You are a patient teacher. Explain the following excerpt from {source} to "
         "a student.\n\n{passage}"),
    _one("explain", "analogy", "{passage}\n\nExplain the idea of this passage using an everyday analogy."),
)

QA: tuple[Template, ...] = (
    _one("qa", "what-if", "Passage:\n{passage}\n\nAccording to this passage, what is the case {cond_word} "
         "{cond}?"),
    _one("qa", "cond-short", "{passage}\n\nQ: {cond_word} {cond}, what does the text say?\nA:"),
    _one("qa", "term-mentions", "How does the text below use the term \"{term}\"? Answer from the text "
         "only.\n\n{passage}"),
    _one("qa", "term-count", "{passage}\n\nThe word \"{term}\" appears {term_count} times above. What is "
         "said about it each time?"),
    _one("qa", "last-sentence", "Text:\n{passage}\n\nWhy does the text end with \"{last}\"?"),
    _one("qa", "true-false", "{passage}\n\nTrue or false: the text above says something about \"{term}\". "
         "Justify your answer with a quote."),
    _one("qa", "three-questions", "Write three questions that the following passage answers, and answer "
         "each of them.\n\n{passage}"),
    _one("qa", "who-for", "Who is the following text written for, and what should they do after reading "
         "it?\n\n{passage}"),
    _one("qa", "evidence", "Using only the passage, what evidence supports its first statement, \"{first}\"?"
         "\n\n{passage}"),
    _one("qa", "find-rule", "Find the rule in this text that applies {cond_word} {cond}, and restate it.\n\n"
         "{passage}"),
)

REWRITE: tuple[Template, ...] = (
    _one("rewrite", "simpler", "Rewrite this text in simpler language, keeping all the information.\n\n{passage}"),
    _one("rewrite", "active-voice", "Rewrite the following using the active voice wherever possible:\n\n{passage}"),
    _one("rewrite", "bullet-points", "Convert this passage into bullet points.\n\n{passage}"),
    _one("rewrite", "friendly", "Rewrite this in a friendly, conversational tone.\n\n{passage}"),
    _one("rewrite", "academic", "Rewrite the text below in an academic register.\n\n{passage}"),
    _one("rewrite", "fix-typos", "Proofread the following text and return a corrected version.\n\n{passage}"),
    _one("rewrite", "table", "Turn the key facts of this passage into a Markdown table.\n\n{passage}"),
    _one("rewrite", "tweet", "{passage}\n\nRewrite the passage above as a short social media post."),
    _one("rewrite", "faq", "Rewrite this excerpt from {source} as a short FAQ with questions and answers.\n\n"
         "{passage}"),
    _one("rewrite", "numbered-steps", "Rewrite this as numbered steps or points, keeping its order:\n\n{passage}"),
    _one("rewrite", "first-person", "Rewrite the text in the first person, as if the author were speaking.\n\n"
         "{passage}"),
    _one("rewrite", "shorten", "Shorten the following text, keeping its meaning:\n\n{passage}"),
)

CONTINUE: tuple[Template, ...] = (
    _one("continue", "next-paragraph", "Write the paragraph that could come after this text.\n\n{passage}"),
    _one("continue", "continue", "Continue the following text:\n\n{passage}"),
    _one("continue", "expand-last", "{passage}\n\nExpand on the last sentence, \"{last}\", in a new paragraph."),
    _one("continue", "add-example", "Add one more paragraph with an example to this text.\n\n{passage}"),
    _one("continue", "conclusion", "Write a concluding paragraph for the following text.\n\n{passage}"),
    _one("continue", "intro", "Write a short introduction that could come before this passage.\n\n{passage}"),
)

# --------------------------------------------------------------------------------------- code
_CODE = "```python\n{code}\n```"
_BUGGY = "```python\n{buggy}\n```"
CODE: tuple[Template, ...] = (
    _one("code", "explain", "What does this Python {kind} do?\n\n" + _CODE),
    _one("code", "explain-lines", "Explain the following code line by line.\n\n" + _CODE),
    _one("code", "one-sentence", _CODE + "\n\nDescribe in one sentence what `{name}` is for."),
    _one("code", "find-bug", "This {kind} has a bug: one operator or constant was changed. Find it and "
         "show the fixed code.\n\n" + _BUGGY),
    _one("code", "review", "Review this code and point out anything that could go wrong.\n\n" + _BUGGY),
    _one("code", "rename", "Rename `{old}` to `{new}` in this code and return the whole {kind}.\n\n" + _CODE),
    _one("code", "add-docstring", "Add a docstring to `{name}` and return the complete code.\n\n" + _CODE),
    _one("code", "type-annotate", _CODE + "\n\nAnnotate this {kind} with type hints."),
    _one("code", "unit-tests", "Write pytest unit tests for this {kind} from `{module}`.\n\n" + _CODE),
    _one("code", "comprehension", "Rewrite the loops in this code as comprehensions where that makes it "
         "clearer.\n\n" + _CODE, requires=("loop",)),
    _one("code", "to-function", "Turn this method of `{cls}` into a plain function.\n\n" + _CODE),
    _one("code", "simplify", "Simplify this code without changing its behaviour.\n\n" + _CODE),
    _one("code", "pseudocode", "Translate this Python {kind} into pseudocode.\n\n" + _CODE),
    _one("code", "complexity", _CODE + "\n\nWhat is the time complexity of `{name}`? Explain."),
    _one("code", "no-comments", "Strip the comments and docstring from this code and return it.\n\n" + _CODE,
         requires=("comments",)),
    _one("code", "errors", "Make this {kind} raise a clear exception on invalid input.\n\n" + _CODE),
)

# --------------------------------------------------------------------------------------- chat
# Multi-turn: earlier assistant turns are facts read off the source by code, so they are right.
CHAT: tuple[Template, ...] = (
    _talk("chat", "passage-then-summary",
          "Here's a passage:\n\n{passage}",
          "Thanks for sharing it. It's an excerpt from {source}, about {words} words long. What would you "
          "like me to do with it?",
          "Summarize it, then tell me the one thing I should remember."),
    _talk("chat", "passage-term",
          "{passage}\n\nIs \"{term}\" important in this text?",
          "It comes up {term_count} times, so it is one of the text's central terms.",
          "Then explain what the text says about it, with quotes."),
    _talk("chat", "passage-first",
          "Help me understand this.\n\n{passage}",
          "Happy to. The text begins: \"{first}\"",
          "Right. Go through the rest of it and explain each point."),
    _talk("chat", "passage-last",
          "{passage}",
          "I've read it. The last sentence is: \"{last}\" Do you have a question about it?",
          "Yes: how does that last sentence follow from the rest?"),
    _talk("chat", "passage-cond",
          "I need to check something in this text.\n\n{passage}",
          "Sure, what do you need to check?",
          "What happens {cond_word} {cond}? Then rewrite that rule in plain words."),
    _talk("chat", "code-then-docstring",
          "What is this?\n\n" + _CODE,
          "That is the `{name}` {kind} from Python's `{module}` module.",
          "Add a docstring and type hints to it, and show the result."),
    _talk("chat", "code-then-tests",
          _CODE + "\n\nCan you tell where this comes from?",
          "It looks like the `{name}` {kind} of the standard library's `{module}` module.",
          "Great. Write two test cases for it and explain what each one checks."),
    _talk("chat", "math-check",
          "{problem}",
          "The answer is {answer}.",
          "Can you show how you got that, step by step?"),
    _talk("chat", "math-doubt",
          "{problem}",
          "I get {answer}.",
          "Are you sure? Check the result in a different way."),
    _talk("chat", "topic-tips",
          "I'd like to learn about {topic}.",
          "Good choice! Would you like an overview, some practical tips, or a plan to get started?",
          "Some practical tips, please, in a numbered list."),
    _talk("chat", "topic-explain",
          "Can you tell me about {topic}?",
          "Sure. Is there a particular aspect of {topic} you're curious about?",
          "Start with the basics, then tell me about a common misconception."),
    _talk("chat", "topic-plan",
          "I want to get better at {topic}.",
          "That's a great goal. How much time can you spend on it each week?",
          "About three hours a week. Make me a four-week plan."),
)

# Asked after the target's own first answer (the second stage of the data: multi-turn
# conversations whose history is the target's text).
FOLLOW_UPS: tuple[Template, ...] = tuple(Template(f"distill/follow-up/{name}", "follow-up", (text,)) for name, text in (
    ("shorter", "Can you make that shorter?"),
    ("bullets", "Please turn your answer into a bulleted list."),
    ("example", "Can you give me a concrete example?"),
    ("more-detail", "Explain the most important point in more detail."),
    ("simpler", "That's a bit complicated. Can you say it more simply?"),
    ("why", "Why is that? Explain your reasoning."),
    ("one-sentence", "Summarize your answer in one sentence."),
    ("formal", "Rewrite your answer in a more formal tone."),
    ("check", "Are you sure? Please double-check your answer."),
    ("next-step", "Thanks! What should I do next?"),
    ("table", "Can you put that in a table?"),
    ("counter", "What would someone who disagrees say?"),
    ("kid", "How would you explain that to a child?"),
    ("title", "Give your answer a title and a one-line summary."),
))

# ------------------------------------------------------------------------------------- topics
TOPIC: tuple[Template, ...] = (
    _one("topic", "beginner", "Explain {topic} to a complete beginner."),
    _one("topic", "three-tips", "Give me three practical tips about {topic}."),
    _one("topic", "mistakes", "What are common mistakes people make with {topic}?"),
    _one("topic", "history", "Briefly, what is the history of {topic}?"),
    _one("topic", "pros-cons", "What are the pros and cons of {topic}?"),
    _one("topic", "faq", "Write a short FAQ about {topic}."),
    _one("topic", "myths", "What are some myths about {topic}, and what is true instead?"),
    _one("topic", "plan", "Make a one-week plan for getting started with {topic}."),
    _one("topic", "email", "Write a short email inviting a friend to try {topic} with me."),
    _one("topic", "poem", "Write a short poem about {topic}."),
)

#: Everyday and technical subjects for the ``topic`` templates; each is its own source (split by name).
TOPICS: tuple[str, ...] = (
    "baking bread", "learning a foreign language", "growing tomatoes", "public speaking", "saving money",
    "running a first marathon", "time management", "keeping a houseplant alive", "chess openings",
    "photography at night", "writing a resume", "meditation", "cycling to work", "composting",
    "learning to swim", "camping in winter", "making coffee", "birdwatching", "playing the guitar",
    "job interviews", "recycling plastics", "volcanoes", "the water cycle", "black holes", "vaccines",
    "the French Revolution", "the Roman Empire", "climate change", "electric cars", "solar panels",
    "sleep hygiene", "healthy breakfasts", "stretching", "team sports", "board games", "knitting",
    "writing short stories", "unit testing", "version control with git", "regular expressions",
    "SQL databases", "binary search", "recursion", "hash tables", "object-oriented programming",
    "functional programming", "web accessibility", "password security", "backups", "spreadsheets",
    "touch typing", "budget travel", "packing light", "first aid", "dog training", "cat care",
    "aquariums", "beekeeping", "astronomy for beginners", "origami", "calligraphy", "sourdough starters",
    "negotiating a salary", "remote work", "note taking", "speed reading", "memory techniques",
    "the printing press", "ancient Egypt", "the moon landing", "earthquakes", "rainforests",
    "coral reefs", "recipes with lentils", "fermentation", "home workouts", "posture at a desk",
    "learning to draw", "watercolour painting", "podcasting", "home networking", "Linux command line",
    "Python virtual environments", "code reviews", "technical writing", "data visualisation",
    "statistics basics", "probability", "compound interest", "renting a flat", "moving house",
    "gardening on a balcony", "winter cycling", "hiking safety", "learning to cook rice",
)


# --------------------------------------------------------------------------------------- math
@dataclass(frozen=True)
class MathTemplate:
    """A problem generator: ``make(rng) -> (problem, answer)``; the phrasing is fixed per template,
    the request style (step by step, short answer, ...) drawn per problem."""

    name: str
    make: Callable[[random.Random], tuple[str, str]]


_STYLES = ("", " Show your work.", " Explain each step.", " Give just the answer with one line of "
           "reasoning.", " Think step by step.", " Answer and check your result.")


def _money(x: float) -> str:
    return f"${x:,.2f}"


def _arith(r: random.Random) -> tuple[str, str]:
    a, b, c = r.randrange(12, 99), r.randrange(3, 40), r.randrange(5, 500)
    op = r.choice(("+", "-"))
    value = a * b + c if op == "+" else a * b - c
    return f"Calculate {a} × {b} {op} {c}.", str(value)


def _parens(r: random.Random) -> tuple[str, str]:
    a, b, c, d = (r.randrange(2, 30) for _ in range(4))
    return f"What is ({a} + {b}) × ({c} - {d})?", str((a + b) * (c - d))


def _percent(r: random.Random) -> tuple[str, str]:
    p, n = r.choice((5, 12, 15, 20, 35, 45, 60, 75, 80)), r.randrange(20, 2000, 10)
    return f"What is {p}% of {n}?", f"{p * n / 100:g}"


def _fractions(r: random.Random) -> tuple[str, str]:
    a, b, c, d = r.randrange(1, 9), r.randrange(2, 12), r.randrange(1, 9), r.randrange(2, 12)
    num, den = a * d + c * b, b * d
    g = math.gcd(num, den)
    return f"Add the fractions {a}/{b} and {c}/{d} and simplify the result.", f"{num // g}/{den // g}"


def _convert(r: random.Random) -> tuple[str, str]:
    kind = r.randrange(4)
    if kind == 0:
        km = round(r.uniform(0.3, 42), 1)
        return f"How many metres are there in {km:g} km?", f"{km * 1000:g} m"
    if kind == 1:
        h, m = r.randrange(2, 30), r.randrange(1, 59)
        return f"How many minutes are there in {h} hours and {m} minutes?", str(h * 60 + m)
    if kind == 2:
        c = r.randrange(-20, 45)
        return f"Convert {c} °C to Fahrenheit.", f"{c * 9 / 5 + 32:g} °F"
    kg = round(r.uniform(0.1, 9.9), 2)
    return f"A parcel weighs {kg:g} kg. How many grams is that?", f"{kg * 1000:g} g"


def _clock(r: random.Random) -> tuple[str, str]:
    h1, m1 = r.randrange(6, 12), r.choice((0, 5, 15, 20, 35, 40, 50))
    dur = r.randrange(35, 600, 5)
    end = h1 * 60 + m1 + dur
    return (f"A film festival screening starts at {h1}:{m1:02d} and lasts {dur} minutes. When does it end?",
            f"{end // 60 % 24}:{end % 60:02d}")


def _shopping(r: random.Random) -> tuple[str, str]:
    n1, p1, n2, p2 = r.randrange(2, 7), r.choice((0.85, 1.2, 2.5, 3.75)), r.randrange(1, 5), r.choice((4.2, 6.99, 9.5))
    total = n1 * p1 + n2 * p2
    bill = 20 if total < 20 else 50 if total < 50 else 100
    return (f"Sam buys {n1} notebooks at {_money(p1)} each and {n2} pens at {_money(p2)} each, and pays with a "
            f"{_money(bill)} bill. How much change does Sam get?", _money(bill - total))


def _mean(r: random.Random) -> tuple[str, str]:
    xs = [r.randrange(10, 100) for _ in range(r.randrange(4, 8))]
    return f"Find the mean and the median of: {', '.join(map(str, xs))}.", f"mean {sum(xs) / len(xs):g}"


def _speed(r: random.Random) -> tuple[str, str]:
    d, t = r.randrange(20, 900, 5), r.choice((0.5, 1.25, 2, 2.5, 3, 4.5))
    return (f"A cyclist covers {d} km in {t:g} hours. What is her average speed, and how far would she go "
            "in 90 minutes at that speed?", f"{d / t:g} km/h")


def _sequence(r: random.Random) -> tuple[str, str]:
    if r.random() < 0.5:
        a, s = r.randrange(1, 30), r.randrange(2, 15)
        xs = [a + s * i for i in range(5)]
        nxt = xs[-1] + s
    else:
        a, q = r.randrange(1, 6), r.choice((2, 3))
        xs = [a * q ** i for i in range(5)]
        nxt = xs[-1] * q
    return f"What is the next number in the sequence {', '.join(map(str, xs))}, ...? Why?", str(nxt)


def _ratio(r: random.Random) -> tuple[str, str]:
    a, b = r.randrange(1, 7), r.randrange(1, 7)
    total = (a + b) * r.randrange(10, 200)
    return (f"Two partners share a profit of {_money(total)} in the ratio {a}:{b}. How much does each get?",
            f"{_money(total * a / (a + b))} and {_money(total * b / (a + b))}")


def _area(r: random.Random) -> tuple[str, str]:
    kind = r.randrange(3)
    if kind == 0:
        w, h = r.randrange(2, 40), r.randrange(2, 40)
        return f"A rectangle is {w} cm wide and {h} cm tall. Find its area and perimeter.", f"{w * h} cm², {2 * (w + h)} cm"
    if kind == 1:
        b, h = r.randrange(2, 30), r.randrange(2, 30)
        return f"A triangle has a base of {b} m and a height of {h} m. What is its area?", f"{b * h / 2:g} m²"
    rad = r.randrange(1, 20)
    return f"What is the area of a circle with radius {rad} cm? Use π ≈ 3.14.", f"{3.14 * rad * rad:.2f} cm²"


def _equation(r: random.Random) -> tuple[str, str]:
    a, x, b = r.randrange(2, 12), r.randrange(-10, 20), r.randrange(1, 50)
    return f"Solve for x: {a}x + {b} = {a * x + b}.", f"x = {x}"


def _buses(r: random.Random) -> tuple[str, str]:
    a, b = r.choice((6, 8, 10, 12, 15)), r.choice((9, 14, 18, 20, 25))
    lcm = a * b // math.gcd(a, b)
    return (f"One bus leaves the depot every {a} minutes and another every {b} minutes. Both left at 8:00. "
            "When do they next leave together?", f"after {lcm} minutes")


def _dice(r: random.Random) -> tuple[str, str]:
    target = r.randrange(3, 12)
    ways = sum(1 for i in range(1, 7) for j in range(1, 7) if i + j == target)
    return f"Two fair dice are rolled. What is the probability that their sum is {target}?", f"{ways}/36"


def _handshakes(r: random.Random) -> tuple[str, str]:
    n = r.randrange(4, 40)
    return f"At a meeting, each of {n} people shakes hands once with every other person. How many handshakes are there?", str(n * (n - 1) // 2)


def _loan(r: random.Random) -> tuple[str, str]:
    p, rate, years = r.randrange(1000, 30000, 500), r.choice((3, 4, 6, 7.5)), r.randrange(1, 6)
    return (f"A loan of {_money(p)} charges {rate:g}% simple interest per year. How much interest is owed after "
            f"{years} years?", _money(p * rate / 100 * years))


def _ages2(r: random.Random) -> tuple[str, str]:
    child, k = r.randrange(3, 15), r.choice((2, 3, 4))
    parent = child * k
    return (f"A mother is {k} times as old as her son. The son is {child}. How old will each be when the "
            f"mother is {parent + child} years old?", f"{2 * child} and {parent + child}")


def _paint(r: random.Random) -> tuple[str, str]:
    w, h, cover = r.randrange(3, 9), r.choice((2.4, 2.5, 2.7, 3)), r.choice((8, 10, 12))
    area = 2 * (w + w) * h
    return (f"A square room is {w} m on each side and {h:g} m high. One litre of paint covers {cover} m². How "
            "many litres are needed for the four walls (ignore doors and windows)?", f"{area / cover:.1f} litres")


MATH: tuple[MathTemplate, ...] = tuple(MathTemplate(f"distill/math/{name}", make) for name, make in (
    ("arithmetic", _arith), ("parentheses", _parens), ("percent", _percent), ("fractions", _fractions),
    ("units", _convert), ("clock", _clock), ("shopping", _shopping), ("mean-median", _mean),
    ("speed", _speed), ("sequence", _sequence), ("ratio", _ratio), ("area", _area),
    ("equation", _equation), ("buses", _buses), ("dice", _dice), ("handshakes", _handshakes),
    ("loan", _loan), ("ages", _ages2), ("paint", _paint),
))


def math_problem(template: MathTemplate, rng: random.Random) -> tuple[str, str]:
    """One problem of ``template`` with a drawn request style, and the generator's answer."""
    problem, answer = template.make(rng)
    return problem + rng.choice(_STYLES), answer


PASSAGE_TEMPLATES: dict[str, tuple[Template, ...]] = {
    "summarize": SUMMARIZE, "explain": EXPLAIN, "qa": QA, "rewrite": REWRITE, "continue": CONTINUE,
}
ALL: tuple[Template, ...] = (*SUMMARIZE, *EXPLAIN, *QA, *REWRITE, *CONTINUE, *CODE, *CHAT, *TOPIC, *FOLLOW_UPS)
