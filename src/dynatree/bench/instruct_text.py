"""The hand-written part of the instruct prompt sets: instruction phrasings, conversations and math
word-problem generators (the builders are in :mod:`dynatree.bench.instruct`).

Every template has a stable ``name``; the name alone decides whether the template is held out
(:func:`dynatree.bench.instruct.template_held_out`), so adding or rewording a template never moves
another one across the split. Renaming a template moves it: that changes the bench's prompt sets
and must not be done to a template a trained draft has seen.

A template is a tuple of turns, user first, alternating with assistant turns, ending with a user
turn (the model writes the next assistant turn). Turns are ``str.format`` strings; the fields a
template names are what it needs from its source (a passage, a function), so a template is only
used with sources that have them:

* passages: ``{passage}``, ``{first}`` / ``{last}`` (first / last sentence), ``{paragraphs}``,
  ``{words}`` (rounded to tens), ``{term}`` and ``{term_count}`` (a word the passage repeats),
  ``{cond}`` with ``{cond_word}`` (an "if"/"when" clause of the passage), ``{source}`` (where it
  comes from, in words);
* functions: ``{code}``, ``{name}``, ``{kind}`` ("function" or "method"), ``{module}``, ``{cls}``
  (methods only), ``{old}`` / ``{new}`` (a local variable and a new name for it), and the markers
  ``{comments}`` / ``{formatting}`` that exist only for code with comments / old-style formatting.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Template:
    """A named conversation skeleton: user, assistant, user, ... turns with ``str.format`` fields."""

    name: str
    turns: tuple[str, ...]
    requires: tuple[str, ...] = ()  # fields the source must have though the text does not show them


def _one(name: str, text: str, requires: tuple[str, ...] = ()) -> Template:
    return Template(name, (text,), requires)


# ----------------------------------------------------------------------------------- summarize
SUMMARIZE: tuple[Template, ...] = (
    _one("summarize/three-sentences", "Summarize the following text in three sentences.\n\n{passage}"),
    _one("summarize/tldr", "{passage}\n\nTL;DR:"),
    _one("summarize/one-paragraph", "Write a one-paragraph summary of this passage:\n\n{passage}"),
    _one("summarize/key-points", "What are the key points of the text below? Summarize them briefly.\n\n"
         "---\n{passage}\n---"),
    _one("summarize/newcomer", "Summarize this for someone new to the topic, in under 100 words.\n\n{passage}"),
    _one("summarize/title-and-summary", "Give this passage a title and a two-sentence summary.\n\n"
         "Text:\n{passage}"),
    _one("summarize/abstract", "Write an abstract of at most 80 words for the following excerpt from "
         "{source}.\n\n{passage}"),
    _one("summarize/one-sentence", "Summarize in one sentence:\n\n{passage}"),
    _one("summarize/no-time", "I don't have time to read all of this. Can you give me a short summary?\n\n"
         "{passage}"),
    _one("summarize/bullet-summary", "Read the text and summarize it as three to five bullet points.\n\n"
         "\"\"\"\n{passage}\n\"\"\""),
)

# ------------------------------------------------------------------------------------- rewrite
REWRITE: tuple[Template, ...] = (
    _one("rewrite/plain-english", "Rewrite the following text in plain English that a beginner can follow. "
         "Keep every fact.\n\n{passage}"),
    _one("rewrite/paraphrase", "Paraphrase this passage sentence by sentence, keeping the meaning the same:"
         "\n\n{passage}"),
    _one("rewrite/bullets", "Turn the text below into a bulleted list, one bullet per point, reusing its "
         "wording where you can.\n\n{passage}"),
    _one("rewrite/formal", "Rewrite the following in a more formal, concise style:\n\"\"\"\n{passage}\n\"\"\""),
    _one("rewrite/markdown", "Reformat this text as Markdown: add a heading, split it into short paragraphs "
         "and put code and names in backticks. Do not change the wording.\n\n{passage}"),
    _one("rewrite/second-person", "Rewrite this text so that it addresses the reader directly as \"you\".\n\n"
         "{passage}"),
    _one("rewrite/shorter", "Make this text about half as long without dropping any rule or definition:"
         "\n\n{passage}"),
    _one("rewrite/copy-edit", "Copy-edit the text below: fix grammar, punctuation and awkward phrasing, and "
         "return the corrected text.\n\n{passage}"),
    _one("rewrite/email", "Rewrite this excerpt from {source} as a short email to a colleague who needs "
         "to know what it says.\n\n{passage}"),
    _one("rewrite/numbered-rules", "{passage}\n\nRewrite the text above as a numbered list of rules or "
         "facts, in the same order as the text."),
)

# ------------------------------------------------------------------------------------------ qa
QA: tuple[Template, ...] = (
    _one("qa/what-happens", "Read the passage and answer the question.\n\nPassage:\n{passage}\n\n"
         "Question: According to the passage, what happens {cond_word} {cond}?"),
    _one("qa/explain-condition", "{passage}\n\nBased only on the text above, explain what the text says "
         "should happen {cond_word} {cond}."),
    _one("qa/quote-condition", "Context:\n\"\"\"\n{passage}\n\"\"\"\n\nUsing only the context, answer: "
         "{cond_word} {cond}, what then? Quote the sentence that answers it."),
    _one("qa/about-term", "Passage:\n{passage}\n\nQuestion: What does the passage say about \"{term}\"?"),
    _one("qa/quote-term", "Here is an excerpt from {source}:\n\n{passage}\n\nQuote the sentences that "
         "mention \"{term}\" and explain what they mean."),
    _one("qa/term-role", "Answer using the document below.\n\nDocument:\n{passage}\n\nWhat role does "
         "\"{term}\" play in this text, and how is it described?"),
    _one("qa/first-claim", "{passage}\n\nQuestion: The text begins with \"{first}\" What does the rest of "
         "the text add to that statement?"),
    _one("qa/yes-no-term", "Read this:\n\n{passage}\n\nDoes the text mention \"{term}\"? If so, what "
         "exactly does it say? Answer in two or three sentences."),
    _one("qa/conclusion", "Text:\n{passage}\n\nQuestion: How does the text end, and how does its last "
         "sentence relate to what comes before it?"),
)

# ---------------------------------------------------------------------------------------- code
_FENCE = "```python\n{code}\n```"
CODE: tuple[Template, ...] = (
    _one("code/type-hints", "Add type hints to all parameters and the return value of this Python {kind}. "
         "Reply with the full edited code.\n\n" + _FENCE),
    _one("code/docstring", _FENCE + "\n\nWrite a Google-style docstring for `{name}` (replacing any existing "
         "one) and show the whole {kind} with it."),
    _one("code/rename-variable", "In the code below, rename the variable `{old}` to `{new}` everywhere it is "
         "used. Return the complete code.\n\n" + _FENCE),
    _one("code/add-comments", "Add brief comments that explain the non-obvious steps of this code, without "
         "changing any statement.\n\n" + _FENCE),
    _one("code/strip-comments", "Remove every comment and the docstring from the following {kind}, leaving "
         "the code itself unchanged:\n\n" + _FENCE, requires=("comments",)),
    _one("code/guard-clauses", "Refactor `{name}` to reduce its nesting (for example with early returns or "
         "guard clauses) without changing its behaviour. Show the refactored code.\n\n" + _FENCE),
    _one("code/logging", "Here is a {kind} from Python's `{module}` module:\n\n" + _FENCE + "\n\nModify it so "
         "that it logs its arguments with `logging.debug` when called and logs the result before returning. "
         "Output the modified code only."),
    _one("code/validate", "Add input validation to the start of this {kind} that raises `ValueError` or "
         "`TypeError` with a clear message on bad arguments. Keep everything else exactly as it is.\n\n"
         + _FENCE),
    _one("code/f-strings", "Update this code to use f-strings instead of `%` formatting or `str.format`, and "
         "return the updated {kind}.\n\n" + _FENCE, requires=("formatting",)),
    _one("code/standalone", "Convert this method of class `{cls}` into a standalone function that receives "
         "what it needs as parameters. Give the full new function.\n\n" + _FENCE),
)

# ---------------------------------------------------------------------------------------- chat
# Conversations about a passage: the assistant turns are facts read off the passage by code (its
# first sentence, its paragraph count, ...), so they are right for every passage.
CHAT_PASSAGE: tuple[Template, ...] = (
    Template("chat/first-sentence", (
        "I'm reading this and I'm a bit lost.\n\n{passage}\n\nWhat is the very first sentence saying?",
        "The text opens with: \"{first}\" It introduces what the rest of the passage builds on.",
        "OK. Now explain the whole passage to me in plain words, one paragraph at a time.")),
    Template("chat/paragraph-titles", (
        "Here is some text I need help with.\n\n{passage}",
        "Thanks, I have read it. It has {paragraphs} paragraph(s) and about {words} words, from {source}. "
        "What would you like to do with it?",
        "Give each paragraph a short title, then summarize the whole text in two sentences.")),
    Template("chat/term-follow-up", (
        "{passage}\n\nDoes this text talk about \"{term}\"?",
        "Yes. \"{term}\" appears {term_count} times in the text.",
        "What does it say about it? Quote the relevant parts and explain them.")),
    Template("chat/ending", (
        "Can you read this for me?\n\n{passage}",
        "Sure, I've read it. It ends with: \"{last}\"",
        "Thanks. Rewrite the whole text as a short list of its key points.")),
    Template("chat/audience", (
        "{passage}",
        "This is an excerpt from {source}. What would you like to know about it?",
        "Who is it written for, and what are the two most important things they should take away from it?")),
    Template("chat/three-turns", (
        "I'm going to paste a text and then ask you a couple of questions about it.\n\n{passage}",
        "Got it. Go ahead with your questions.",
        "First: what is the main topic, in one sentence?",
        "The main topic is what its opening sentence sets up: \"{first}\"",
        "Good. Second: {cond_word} {cond}, what does the text say happens? Quote it.")),
)

# Hand-written conversations; each one is its own template (no source document).
CHAT_TALKS: tuple[Template, ...] = (
    Template("chat/talk-list-comprehension", (
        "What is a list comprehension in Python?",
        "A list comprehension builds a list from an iterable in one expression. For example, "
        "`squares = [n * n for n in range(10)]` makes the squares of 0 to 9, and you can filter with a "
        "condition: `evens = [n for n in range(10) if n % 2 == 0]`.",
        "Can you rewrite this loop as a list comprehension and explain each part?\n\n"
        "result = []\nfor word in words:\n    if len(word) > 3:\n        result.append(word.upper())")),
    Template("chat/talk-git-branch", (
        "How do I create a new branch in git and switch to it?",
        "Run `git switch -c my-branch` (or, on older versions, `git checkout -b my-branch`). It creates the "
        "branch at your current commit and switches to it.",
        "I made some commits on the wrong branch. How do I move them to the new branch instead?")),
    Template("chat/talk-pasta", (
        "I want to cook pasta for four people tonight. How much dried pasta should I buy?",
        "About 100 grams of dried pasta per person is a common portion, so 400 to 500 grams for four "
        "people, a little more if they are very hungry.",
        "Great. Give me a simple tomato sauce recipe to go with it, with a shopping list.")),
    Template("chat/talk-recursion", (
        "Explain recursion like I'm ten years old.",
        "Imagine you are in a line of people and want to know your place. You ask the person in front of "
        "you, who asks the person in front of them, and so on, until the first person says \"I'm number "
        "one\". Then each person adds one and passes the answer back. A recursive function does the same: "
        "it solves a small version of the problem and builds on the answer.",
        "Nice! Now show me a recursive Python function that counts down from a number to zero, and explain "
        "what stops it.")),
    Template("chat/talk-landlord", (
        "My kitchen tap has been leaking for two weeks. Can you help me write to my landlord?",
        "Of course. Tell me your landlord's name, when the leak started and whether you have already "
        "reported it, and I'll draft a polite but clear message.",
        "Her name is Mrs. Patel, it started on the 3rd of this month, and I mentioned it on the phone last "
        "week but nothing happened. Please write the email.")),
    Template("chat/talk-sql-join", (
        "What's the difference between an INNER JOIN and a LEFT JOIN in SQL?",
        "An INNER JOIN returns only rows that have a match in both tables. A LEFT JOIN returns every row of "
        "the left table, with the matching columns of the right table, or NULLs where there is no match.",
        "I have tables customers(id, name) and orders(id, customer_id, total). Write a query that lists "
        "every customer with the number of orders they placed, including customers with no orders.")),
    Template("chat/talk-packing", (
        "I'm going hiking for a weekend in the mountains. What should I pack?",
        "Pack layers (a base layer, a warm fleece and a waterproof jacket), sturdy boots, a map and compass "
        "or charged phone, water and snacks, a first-aid kit, sun protection, and a head torch.",
        "It will be close to freezing at night and I'm camping. What else do I need, and what can I leave "
        "out to keep my bag light?")),
    Template("chat/talk-key-error", (
        "My Python script crashes with KeyError: 'price'. What does that mean?",
        "A KeyError means the code looked up a key in a dictionary that is not there. Somewhere you have "
        "something like `item['price']`, and at least one item has no 'price' key.",
        "Here is the code:\n\nfor item in cart:\n    total += item['price'] * item['qty']\n\nHow can I fix it "
        "so items without a price are skipped, and show me the corrected loop?")),
    Template("chat/talk-cover-letter", (
        "I'm applying for a junior data analyst job. Should my cover letter repeat my CV?",
        "No. A cover letter should say why you want this particular job and connect two or three of your "
        "strongest experiences to what the employer needs, in about three short paragraphs.",
        "I did an internship where I cleaned sales data in Excel and built a dashboard. Write an opening "
        "paragraph for my cover letter using that.")),
    Template("chat/talk-exercise", (
        "I want to start running but I've never done any sport. Where do I begin?",
        "Start with run-walk intervals: for example one minute of easy running and two minutes of walking, "
        "repeated eight times, three days a week. Increase the running time slowly over a few weeks.",
        "Make me a four-week plan based on that, as a table with one row per week.")),
    Template("chat/talk-units", (
        "How many centimetres are in an inch?",
        "One inch is exactly 2.54 centimetres.",
        "Then how tall is someone who is 5 feet 9 inches, in centimetres? Show the calculation.")),
    Template("chat/talk-poem", (
        "Write a four-line poem about autumn leaves.",
        "Red and gold, the maples sigh,\nletting go against the sky;\neach leaf a letter, softly penned,\n"
        "that summer, too, must have an end.",
        "Lovely. Now rewrite it so that it rhymes AABB and mentions the wind.")),
    Template("chat/talk-birthday", (
        "I'm organising a surprise birthday party for my dad's 60th. Where should I start?",
        "Start with the date, a guest list and a budget. Then pick a place, find one person who can keep "
        "your dad busy on the day, and send invitations that say clearly it's a surprise.",
        "We have a budget of 500 euros and about 25 guests. Suggest a plan with a rough split of the "
        "budget.")),
    Template("chat/talk-photosynthesis", (
        "What is photosynthesis?",
        "Photosynthesis is how plants, algae and some bacteria make their food: they use the energy of "
        "light to turn carbon dioxide and water into glucose, and release oxygen as a by-product.",
        "Why are most leaves green then, and what happens to them in autumn?")),
    Template("chat/talk-regex", (
        "How do I check in Python whether a string is a valid date in the format YYYY-MM-DD?",
        "The safest way is to try parsing it: `datetime.date.fromisoformat(text)` raises ValueError if the "
        "text is not a valid date, so it also rejects dates like 2023-02-30.",
        "I'd also like to find all such dates inside a longer text. Write a function that returns them as "
        "date objects and skips invalid ones.")),
    Template("chat/talk-budget", (
        "I earn 2,400 a month after tax. How should I split it?",
        "A common starting point is the 50/30/20 rule: about 50% for needs (rent, bills, food), 30% for "
        "wants and 20% for savings or paying off debt. For 2,400 that is 1,200, 720 and 480.",
        "My rent alone is 1,000 and I have a 3,000 credit card debt. Adjust the plan for that and tell me "
        "how long it would take to pay the debt off.")),
    Template("chat/talk-history", (
        "Who built the first printing press with movable type in Europe?",
        "Johannes Gutenberg, in Mainz, around 1440 to 1450. His best-known work is the Gutenberg Bible, "
        "printed in the 1450s.",
        "How did his press change the spread of books in the following fifty years?")),
    Template("chat/talk-email-tone", (
        "Can you make this sound more polite? \"Send me the report by Friday.\"",
        "Sure: \"Could you please send me the report by Friday? Thank you!\"",
        "Thanks. Now make it polite but firm, because this is the third time I'm asking.")),
)

CHAT: tuple[Template, ...] = CHAT_PASSAGE + CHAT_TALKS


# ---------------------------------------------------------------------------------------- math
@dataclass(frozen=True)
class MathTemplate:
    """A word problem generated from random numbers (``make(rng)``), its phrasing fixed."""

    name: str
    make: Callable[[random.Random], str]


def _bakery(r: random.Random) -> str:
    a = r.randrange(60, 240, 5)
    b, c = r.randrange(10, a // 2), r.randrange(5, a // 3)
    d = r.choice((5, 6, 7))
    return (f"A bakery bakes {a} loaves of bread every morning. It sells {b} loaves before noon and {c} in the "
            f"afternoon, and gives the rest to a food bank. The bakery is open {d} days a week. How many loaves "
            "does the food bank get each week? Solve it step by step.")


def _discount(r: random.Random) -> str:
    p, q, t = r.randrange(40, 400), r.choice((10, 15, 20, 25, 30, 40)), r.choice((5, 7, 8, 10, 12))
    return (f"A jacket costs ${p}. It is on sale for {q}% off, and a {t}% sales tax is then added to the sale "
            "price. What does the jacket cost in the end? Round to the cent and show your work.")


def _train(r: random.Random) -> str:
    v = r.choice((60, 72, 80, 90, 96, 120))
    minutes = r.choice((45, 75, 90, 105, 135, 150))
    d = v * minutes // 60
    h, m = r.randrange(6, 20), r.choice((0, 10, 15, 20, 30, 40, 45, 50))
    return (f"A train leaves the station at {h}:{m:02d} and travels {d} km at an average speed of {v} km/h. At "
            "what time does it arrive? Explain your reasoning.")


def _savings(r: random.Random) -> str:
    a, b = r.randrange(50, 500, 10), r.randrange(120, 400, 10)
    c = r.randrange(40, b - 30, 5)
    g = a + (b - c) * r.randrange(4, 20) - r.randrange(0, b - c)
    return (f"Maya has ${a} saved. She earns ${b} a week from a part-time job and spends ${c} of it each week. "
            f"After how many weeks will she have at least ${g}? Think it through step by step.")


def _garden(r: random.Random) -> str:
    length, width, path = r.randrange(8, 40), r.randrange(5, 25), r.choice((1, 1.5, 2, 2.5, 3))
    return (f"A rectangular garden is {length} m long and {width} m wide. A path {path} m wide runs all the way "
            "around the outside of the garden. What is the area of the path? Show each step.")


def _ages(r: random.Random) -> str:
    sister, gap, later = r.randrange(4, 30), r.randrange(2, 12), r.randrange(2, 15)
    total = (sister + gap + later) + (sister + later)
    return (f"Tom is {gap} years older than his sister. In {later} years, the sum of their ages will be "
            f"{total}. How old is Tom now? Solve it step by step.")


def _recipe(r: random.Random) -> str:
    n, flour, eggs = r.choice((2, 4, 6)), r.randrange(150, 600, 25), r.randrange(1, 5)
    m = r.choice(tuple(k for k in range(3, 15) if k != n))
    return (f"A recipe for {n} people needs {flour} grams of flour and {eggs} eggs. How much flour and how "
            f"many eggs are needed for {m} people? Eggs come whole, so round up. Explain how you scaled it.")


def _workers(r: random.Random) -> str:
    w, h, d = r.randrange(2, 10), r.randrange(2, 8), r.randrange(3, 15)
    w2, h2 = r.randrange(2, 15), r.randrange(2, 12)
    return (f"{w} painters can paint {h} houses in {d} days. Working at the same rate, how many days would "
            f"{w2} painters need to paint {h2} houses? Give the answer as a fraction or a decimal and explain "
            "the steps.")


def _average(r: random.Random) -> str:
    scores = [r.randrange(55, 100) for _ in range(4)]
    target = r.randrange(70, 95)
    return (f"A student scored {scores[0]}, {scores[1]}, {scores[2]} and {scores[3]} on four tests. What score "
            f"does she need on the fifth test for an average of {target} over all five? Is that possible if "
            "the maximum score is 100? Show your work.")


def _fuel(r: random.Random) -> str:
    per100, price, d = r.choice((4.5, 5.2, 6, 6.8, 7.5, 8.1)), r.choice((1.45, 1.62, 1.79, 1.89)), r.randrange(40, 400, 5)
    return (f"A car uses {per100} litres of fuel per 100 km, and fuel costs ${price} per litre. How much does "
            f"the fuel for a round trip cost if the destination is {d} km away? Solve step by step and round "
            "to the cent.")


def _tank(r: random.Random) -> str:
    fill, leak = r.randrange(12, 40), r.randrange(2, 10)
    volume = (fill - leak) * r.randrange(10, 60)
    return (f"A water tank holds {volume} litres. A pipe fills it at {fill} litres per minute, while a leak "
            f"drains {leak} litres per minute. Starting from empty, how many minutes does it take to fill the "
            "tank? Explain your answer.")


def _library(r: random.Random) -> str:
    n = r.randrange(3, 40) * 300
    p = r.choice((20, 25, 40, 50, 60, 75))
    return (f"A library has {n} books. {p}% of them are fiction, and a third of the remaining books are "
            "science books. How many science books does the library have? Work it out step by step.")


def _marbles(r: random.Random) -> str:
    k, f = r.randrange(2, 7), r.randrange(3, 12)
    a = k * f + r.randrange(5, 60)
    packs, per = r.randrange(2, 6), r.choice((6, 8, 10, 12, 20))
    return (f"Ali has {a} marbles. He gives {f} marbles to each of his {k} friends, then buys {packs} packs of "
            f"{per} marbles. How many marbles does he have now? Show each step.")


def _interest(r: random.Random) -> str:
    p, rate, years = r.randrange(500, 20000, 100), r.choice((1.5, 2, 2.5, 3, 4, 5)), r.randrange(2, 11)
    return (f"You deposit ${p} in a savings account that pays {rate}% interest, compounded once a year. How "
            f"much is in the account after {years} years? Round to the cent and explain the formula you use.")


def _pizza(r: random.Random) -> str:
    slices, people = r.choice((8, 10, 12)), r.randrange(3, 13)
    each = r.randrange(2, 5)
    return (f"Each pizza is cut into {slices} slices. {people} friends each want to eat {each} slices. How many "
            "pizzas do they need to order, and how many slices will be left over? Reason step by step.")


def _speed_meet(r: random.Random) -> str:
    v1, v2 = r.randrange(3, 7), r.randrange(8, 25)
    hours = r.choice((0.5, 1, 1.5, 2, 2.5))
    d = round((v1 + v2) * hours, 1)
    d_text = f"{d:g}"
    return (f"Two friends live {d_text} km apart. One walks towards the other at {v1} km/h while the other "
            f"cycles towards the first at {v2} km/h, both starting at the same time. After how long do they "
            "meet, and how far has the walker gone? Show your reasoning.")


MATH: tuple[MathTemplate, ...] = (
    MathTemplate("math/bakery", _bakery), MathTemplate("math/discount", _discount),
    MathTemplate("math/train", _train), MathTemplate("math/savings", _savings),
    MathTemplate("math/garden-path", _garden), MathTemplate("math/ages", _ages),
    MathTemplate("math/recipe", _recipe), MathTemplate("math/painters", _workers),
    MathTemplate("math/test-average", _average), MathTemplate("math/fuel", _fuel),
    MathTemplate("math/leaky-tank", _tank), MathTemplate("math/library", _library),
    MathTemplate("math/marbles", _marbles), MathTemplate("math/interest", _interest),
    MathTemplate("math/pizza", _pizza), MathTemplate("math/meeting", _speed_meet),
)
