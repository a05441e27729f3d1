"""Text-to-SQL examples without end: procedural schemas, names and questions (the SQL train data).

    from sqlgen import examples, train_split
    it = examples(seed=0)          # an endless, seed-determined stream of fresh examples
    rows = train_split(30000, 0)   # the finite train split of data/sql (distinct prompts)

Every table and column name is composed on the fly from pieces -- pronounceable pseudo-words
built from syllables, identifier words and English words of the train-split standard library
modules (``data/sql_words.py``), entity nouns, role words ("price", "founded", "count") and unit
suffixes ("_km", "_usd") -- in compounds such as ``brivel_plant`` (table) or
``num_tarek_seats`` (column), so no list of names can be memorised: the model has to copy
names from the ``CREATE TABLE`` context. A column's role gives its SQL type (INTEGER, REAL,
TEXT, DATE), its values and how a question says it ("length_km" -> "length in kilometres",
"num_rooms" -> "number of rooms", "founded" -> "founding year"). Each query form has at least
six phrasings (``FORMS``; the one used is recorded in ``meta["phrasing"]``).

The fixed valid/test splits of ``data/sql`` (made by ``scripts/make_data.py`` from hand-written
domains) stay held out: no example's prompt equals one of theirs, and no table is named like
one of their tables. Prompt format (``SQL_PROMPT``) and completion (one SQLite query, no
trailing ``;``) are those of the valid/test splits; every query runs on its context in sqlite3
(``check_sql``).
"""

from __future__ import annotations

import functools
import json
import math
import random
import re
import sqlite3
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "data"))

import sql_domains  # noqa: E402  (value pools: people, cities, countries, companies)
import sql_words  # noqa: E402  (identifier and English words of the train-split stdlib modules)

SQL_PROMPT = "### Context:\n{context}\n### Question:\n{question}\n### SQL:\n"
HELD_OUT_FILES = (ROOT / "data" / "sql" / "valid.jsonl", ROOT / "data" / "sql" / "test.jsonl")


def sql_prompt(context: str, question: str) -> str:
    return SQL_PROMPT.format(context=context, question=question)


def context(prompt: str) -> str:
    """The ``CREATE TABLE`` statements of a prompt made by :func:`sql_prompt`."""
    return prompt.split("### Context:\n", 1)[1].split("\n### Question:", 1)[0]


def check_sql(example: dict) -> None:
    """Raise ``sqlite3.Error`` if the completion does not run on the tables of the prompt's context."""
    ctx = context(example["prompt"])
    con = sqlite3.connect(":memory:")
    try:
        con.executescript(ctx)
        con.execute(example["completion"]).fetchall()
    finally:
        con.close()


@dataclass(frozen=True)
class HeldOut:
    prompts: frozenset[str]
    tables: frozenset[str]


@functools.cache
def held_out(files: tuple[Path, ...] = HELD_OUT_FILES) -> HeldOut:
    """The prompts and table names of the fixed valid/test splits, which the generator never emits."""
    prompts = set()
    for path in files:
        with open(path, encoding="utf-8") as f:
            prompts |= {json.loads(line)["prompt"] for line in f}
    tables = {m for p in prompts for m in re.findall(r"CREATE TABLE (\w+) \(", p)}
    return HeldOut(frozenset(prompts), frozenset(tables))


# --------------------------------------------------------------------------------------------
# name pieces
# --------------------------------------------------------------------------------------------
ONSETS = (
    "b bl br c ch cl cr d dr f fl fr g gl gr h j k l m n p pl pr r s sc sh sk sl sn sp st str t th tr v w z"
).split()
VOWELS = "a e i o u a e i o u ai ea ee io oo ou".split()
CODAS = ["", "", "", "", "n", "r", "l", "s", "t", "m", "k", "nd", "rt", "st", "x", "ng", "sh"]
ENTITIES = [e.split("/")[0] for e in sql_domains.PROC_ENTITIES]
RESERVED = {
    "abort",
    "action",
    "add",
    "after",
    "all",
    "alter",
    "and",
    "as",
    "asc",
    "before",
    "begin",
    "between",
    "by",
    "case",
    "cast",
    "check",
    "collate",
    "column",
    "commit",
    "constraint",
    "create",
    "cross",
    "current",
    "default",
    "delete",
    "desc",
    "distinct",
    "drop",
    "each",
    "else",
    "end",
    "escape",
    "except",
    "exists",
    "filter",
    "for",
    "foreign",
    "from",
    "full",
    "glob",
    "group",
    "having",
    "if",
    "in",
    "index",
    "inner",
    "insert",
    "intersect",
    "into",
    "is",
    "join",
    "key",
    "left",
    "like",
    "limit",
    "match",
    "natural",
    "no",
    "not",
    "null",
    "of",
    "offset",
    "on",
    "or",
    "order",
    "outer",
    "over",
    "plan",
    "pragma",
    "primary",
    "query",
    "range",
    "raise",
    "recursive",
    "references",
    "regexp",
    "release",
    "rename",
    "replace",
    "right",
    "row",
    "rows",
    "select",
    "set",
    "table",
    "then",
    "to",
    "union",
    "unique",
    "update",
    "using",
    "values",
    "view",
    "when",
    "where",
    "window",
    "with",
}


def pseudo_word(rng: random.Random, lo: int = 1, hi: int = 3) -> str:
    """A pronounceable made-up word of lo..hi syllables ("brivel", "toscamar", "airmond"). A quarter
    of them start with a vowel: otherwise no name starts with a piece such as ``▁air`` or ``▁out``,
    and a model trained long on such names stops copying those pieces (docs/default-model.md)."""
    while True:
        w = "".join(
            ("" if i == 0 and rng.random() < 0.25 else rng.choice(ONSETS))
            + rng.choice(VOWELS) + rng.choice(CODAS)
            for i in range(rng.randint(lo, hi))
        )
        if 3 <= len(w) <= 12 and w not in RESERVED:
            return w


def piece(rng: random.Random) -> str:
    """One word of a name: made up, a stdlib identifier word, an English word or an entity noun."""
    r = rng.random()
    if r < 0.35:
        return pseudo_word(rng)
    pool = sql_words.WORDS if r < 0.55 else sql_words.PROSE if r < 0.8 else ENTITIES
    return rng.choice(pool).split("_")[-1]


def plural(word: str) -> str:
    if re.search(r"(s|x|z|ch|sh)$", word):
        return word + "es"
    if re.search(r"[^aeiou]y$", word):
        return word[:-1] + "ies"
    return word + "s"


# --------------------------------------------------------------------------------------------
# schemas: columns with a role (type, values, phrase), tables, a parent and child with a key
# --------------------------------------------------------------------------------------------
UNITS = {
    "m": ["in metres", "in meters", "in m"],
    "sqm": ["in square meters", "in square metres"],
    "km": ["in kilometres", "in km", "in kilometers"],
    "cm": ["in centimetres", "in cm"],
    "kg": ["in kilograms", "in kg"],
    "t": ["in tonnes"],
    "mw": ["in megawatts", "in MW"],
    "kw": ["in kilowatts", "in kW"],
    "l": ["in litres", "in liters"],
    "hours": ["in hours"],
    "min": ["in minutes"],
    "s": ["in seconds"],
    "days": ["in days"],
    "kmh": ["in km per hour", "in kilometres per hour"],
    "mph": ["in miles per hour", "in mph"],
    "c": ["in degrees Celsius", "in Celsius"],
    "usd": ["in dollars", "in USD"],
    "eur": ["in euros", "in EUR"],
    "pct": ["in percent", "as a percentage"],
}
NUMBER_UNITS = {  # a unit as it follows a number: "30 metres"
    "m": ["metres", "meters", "m"], "sqm": ["square metres", "square meters"], "km": ["kilometres", "km"],
    "cm": ["centimetres", "cm"], "kg": ["kilograms", "kg"], "t": ["tonnes"], "mw": ["megawatts", "MW"],
    "kw": ["kilowatts", "kW"], "l": ["litres", "liters"], "hours": ["hours"], "min": ["minutes"],
    "s": ["seconds"], "days": ["days"], "kmh": ["km per hour"], "mph": ["mph"], "c": ["degrees"],
    "usd": ["dollars"], "eur": ["euros"], "pct": ["percent"],
}
COMPARATIVES = {  # a measure's "more" and "less" adjectives, when they name it: "taller than 30 metres"
    "length": ("longer", "shorter"), "height": ("taller", "shorter"), "width": ("wider", "narrower"),
    "depth": ("deeper", "shallower"), "weight": ("heavier", "lighter"), "mass": ("heavier", "lighter"),
    "distance": ("farther", "nearer"), "speed": ("faster", "slower"),
    "temperature": ("hotter", "colder"), "duration": ("longer", "shorter"), "range": ("longer", "shorter"),
    "runtime": ("longer", "shorter"), "delay": ("longer", "shorter"),
    "power": ("more powerful", "less powerful"),
    "price": ("more expensive", "cheaper"), "cost": ("more expensive", "cheaper"),
    "fee": ("more expensive", "cheaper"), "fare": ("more expensive", "cheaper"),
    "rent": ("more expensive", "cheaper"),
}
UNIT_WORDS = {"min": "minutes", "hours": "hours", "s": "seconds", "days": "days", "kg": "kilograms",
              "l": "litres", "km": "kilometres", "m": "metres"}
MEASURES = {
    "length": "m km cm",
    "height": "m cm",
    "width": "m cm",
    "depth": "m km",
    "weight": "kg t",
    "distance": "km m",
    "area": "sqm",
    "capacity": "mw kw l",
    "speed": "kmh mph",
    "volume": "l",
    "temperature": "c",
    "duration": "hours min s days",
    "power": "mw kw",
    "elevation": "m",
    "altitude": "m km",
    "range": "km",
    "size": "m kg",
    "output": "mw kw",
    "mass": "kg t",
    "runtime": "min hours",
    "delay": "min s",
    "depth_below": "m",
}
MONEY = (
    "price cost fee budget salary revenue income amount balance rent fare payment prize donation "
    "spend profit wage".split()
)
RATINGS = {
    "rating": (0, 10),
    "score": (0, 100),
    "ratio": (0, 5),
    "rate": (0, 100),
    "share": (0, 100),
    "accuracy": (0, 100),
    "grade": (1, 10),
}
COUNTS = (
    "seats members floors visitors copies pages rooms staff wins losses votes points goals laps "
    "episodes stops employees students tickets beds lanes doors branches guests players items".split()
)
YEARS = {
    "founded": ["founding year", "year founded"],
    "established": ["year established", "year of establishment"],
    "built": ["year built", "construction year"],
    "opened": ["opening year", "year opened"],
    "launched": ["launch year", "year launched"],
    "year": ["year"],
    "debut": ["debut year", "year of debut"],
    "released": ["release year", "year released"],
}
EVENTS = (
    "start end birth release opening hire signup launch purchase delivery visit join due issue "
    "expiry arrival departure renewal inspection".split()
)
EVENT_VERBS = {
    "filed": "filing",
    "listed": "listing",
    "signed": "signing",
    "booked": "booking",
    "shipped": "shipping",
    "posted": "posting",
    "hired": "hiring",
    "opened": "opening",
    "closed": "closing",
    "registered": "registration",
    "scheduled": "scheduling",
}
QUALIFIERS_BEFORE = "annual recorded reported current official estimated average".split()
QUALIFIERS_AFTER = "caught sought country rating level amount value figure".split()
CATEGORIES = (
    "type kind status category level tier mode grade class genre material shape style group "
    "zone format section division sector size_class variant".split()
)
PLACE_POOLS = {
    "country": "country",
    "origin": "country",
    "nationality": "country",
    "flag": "country",
    "city": "city",
    "hometown": "city",
    "location": "city",
    "base": "city",
    "color": "color",
    "colour": "color",
    "county": "place",
    "region": "place",
    "state": "place",
    "province": "place",
    "district": "place",
    "port": "city",
}
PLACE_SUFFIXES = ("shire", "land", "ton", " Valley", " Coast", "ia")
PLACES = {"country", "city", "location", "base", "county", "region", "state", "province", "district", "port"}
NAMES = {
    "name": "person title word",
    "title": "title",
    "label": "word",
    "owner": "person",
    "manager": "person",
    "author": "person",
    "host": "person",
    "captain": "person",
    "contact": "person",
    "maker": "company",
    "brand": "company",
    "code": "code",
    "serial": "code",
    "reference": "code",
    "nickname": "first",
    "director": "person",
    "sponsor": "company",
}


@dataclass(eq=False)
class Column:
    name: str
    type: str  # INTEGER, REAL, TEXT, DATE
    role: str  # key, fk, name, category, number, date
    phrase: str
    values: Callable[[random.Random], str] | None = None  # a SQL literal
    lo: float = 0.0
    hi: float = 0.0
    unit: str | None = None  # a measure's or an amount's unit: "m" ("taller than 30 metres")
    more_less: tuple[str, str] | None = None  # comparatives: ("taller", "shorter") for a height
    place: bool = False  # a place ("lighthouses in Cornwall" for county = 'Cornwall')

    @property
    def is_key(self) -> bool:
        return self.role in ("key", "fk")

    @property
    def numeric(self) -> bool:
        return self.type in ("INTEGER", "REAL") and not self.is_key

    @property
    def ordered(self) -> bool:  # compared, sorted, in BETWEEN
        return self.numeric or self.type == "DATE"

    @property
    def textual(self) -> bool:
        return self.type == "TEXT"

    @property
    def categorical(self) -> bool:  # few values: GROUP BY, DISTINCT, !=
        return self.role == "category"

    @property
    def namelike(self) -> bool:  # LIKE
        return self.role == "name"


@dataclass(eq=False)
class Table:
    name: str
    ent: str  # how a question says one row: "power plant"
    ents: str  # and several: "power plants"
    columns: list[Column] = field(default_factory=list)

    @property
    def key(self) -> Column:
        return next(c for c in self.columns if c.role == "key")


def q(v: str) -> str:
    """A SQL string literal."""
    return "'" + v.replace("'", "''") + "'"


def text_pool(rng: random.Random, kind: str) -> Callable[[random.Random], str]:
    P = sql_domains.POOLS

    def person(r):
        if r.random() < 0.5:
            return f"{r.choice(P['first'])} {r.choice(P['last'])}"
        return f"{pseudo_word(r, 1, 2).capitalize()} {pseudo_word(r, 1, 3).capitalize()}"

    def title(r):
        if r.random() < 0.5:
            return f"{r.choice(P['adj'])} {r.choice(P['noun'])}"
        return " ".join(pseudo_word(r, 1, 2).capitalize() for _ in range(r.randint(1, 3)))

    def company(r):
        stem = r.choice(P["costem"]) if r.random() < 0.4 else pseudo_word(r, 2, 3).capitalize()
        return f"{stem} {r.choice(P['cosuffix'])}"

    def code(r):
        letters = "ABCDEFGHJKLMNPRSTUVWXYZ"
        return r.choice(letters) + r.choice(letters) + str(r.randint(10, 9999))

    gens = {
        "person": person,
        "title": title,
        "company": company,
        "code": code,
        "word": lambda r: pseudo_word(r).capitalize(),
        "place": lambda r: (pseudo_word(r, 2, 3).capitalize()
                            + (r.choice(PLACE_SUFFIXES) if r.random() < 0.3 else "")),
        "first": lambda r: r.choice(P["first"]),
    }
    if kind in gens:
        return lambda r: q(gens[kind](r))
    if kind in P:
        return lambda r: q(r.choice(P[kind]))
    # a made-up category with a handful of values, shared by the whole column
    style = rng.random()
    vals = [pseudo_word(rng, 1, 2) for _ in range(rng.randint(3, 7))]
    vals = [v.capitalize() for v in vals] if style < 0.5 else vals
    return lambda r: q(r.choice(vals))


def number_range(rng: random.Random, lo: float, hi_max: float) -> tuple[float, float]:
    """A column's value range: from lo up to a random order of magnitude, at most hi_max."""
    return lo, min(hi_max, lo + 10 ** rng.uniform(1, math.log10(hi_max)))


def compose(rng: random.Random, head: str, ent: str, ent_p: float = 0.12) -> tuple[str, str]:
    """(name, phrase) of a head word with an optional modifier piece or, with probability
    ``ent_p``, the table's entity ("hotel_name" -> "hotel name", as real schemas name things)."""
    r = rng.random()
    if r < ent_p:
        return f"{ent}_{head}", f"{ent.replace('_', ' ')} {head.replace('_', ' ')}"
    r = (r - ent_p) / (1 - ent_p)
    if r < 0.22:
        m = piece(rng)
        return f"{m}_{head}", f"{m} {head.replace('_', ' ')}"
    if r < 0.29:  # "years_experience" -> "years of experience"
        m = piece(rng)
        return f"{head}_{m}", f"{head.replace('_', ' ')} of {m}"
    return head, head.replace("_", " ")


def make_column(rng: random.Random, ent: str) -> Column:
    """A column of a random role (``role_column``); now and then a number's phrase has a word more
    than its name, as people say it ("tonnes" -> "tonnes caught", "visitors" -> "annual visitors")."""
    col = role_column(rng, ent)
    if col.role == "number" and " in " not in col.phrase and rng.random() < 0.12:
        if rng.random() < 0.5:
            col.phrase = f"{rng.choice(QUALIFIERS_BEFORE)} {col.phrase}"
        else:
            col.phrase = f"{col.phrase} {rng.choice(QUALIFIERS_AFTER)}"
    return col


def role_column(rng: random.Random, ent: str) -> Column:
    """A column of a random role; its name, type, values and phrase follow from the role."""
    role = rng.choices(
        ["name", "category", "measure", "money", "rating", "count", "year", "date", "made_up"],
        [3, 3, 2, 1.5, 1, 1.5, 1, 1.5, 1.5],
    )[0]
    if role == "made_up":  # a bare made-up word whose meaning only its type and values tell
        name = pseudo_word(rng, 2, 3)
        phrase = name
        if rng.random() < 0.25:  # an acronym, said in capitals ("gpa" -> "GPA")
            name = "".join(rng.choice("abcdefghiklmnoprstuvwxyz") for _ in range(rng.randint(2, 4)))
            phrase = name.upper()
        kind = rng.choice(["name", "category", "number"])
        if kind == "number":
            lo, hi = number_range(rng, 0, 1e5)
            return Column(name, rng.choice(["INTEGER", "REAL"]), "number", phrase, lo=lo, hi=hi)
        return Column(name, "TEXT", kind, phrase, text_pool(rng, "word" if kind == "name" else ""))
    if role == "name":
        head = "name" if rng.random() < 0.35 else rng.choice(list(NAMES))  # the commonest column
        name, phrase = compose(rng, head, ent, 0.4 if head in ("name", "title") else 0.12)
        return Column(name, "TEXT", "name", phrase, text_pool(rng, rng.choice(NAMES[head].split())))
    if role == "category":
        head = rng.choice(CATEGORIES + list(PLACE_POOLS)) if rng.random() < 0.75 else piece(rng)
        name, phrase = compose(rng, head, ent)
        return Column(name, "TEXT", "category", phrase, text_pool(rng, PLACE_POOLS.get(head, "")),
                      place=head in PLACES and name.endswith(head))
    if role == "measure":
        head = rng.choice(list(MEASURES))
        unit = rng.choice(MEASURES[head].split()) if rng.random() < 0.6 else None
        name, phrase = compose(rng, head, ent)
        if unit in UNIT_WORDS and rng.random() < 0.2:  # named by its unit: "minutes" -> "length in minutes"
            name, phrase = UNIT_WORDS[unit], f"{head.replace('_', ' ')} in {UNIT_WORDS[unit]}"
        elif unit:  # in the name and the phrase, or, now and then, in the phrase alone
            name = name if rng.random() < 0.2 else f"{name}_{unit}"
            phrase = f"{phrase} {rng.choice(UNITS[unit])}"
        lo, hi = number_range(rng, 0, 1e6)
        return Column(name, rng.choice(["INTEGER", "REAL"]), "number", phrase, lo=lo, hi=hi, unit=unit,
                      more_less=COMPARATIVES.get(head) if name.split("_")[0] == head else None)
    if role == "money":
        head = rng.choice(MONEY)
        name, phrase = compose(rng, head, ent)
        more_less = COMPARATIVES.get(head) if name == head else None
        if rng.random() < 0.25:
            unit = rng.choice(["usd", "eur"])
            name, phrase = f"{name}_{unit}", f"{phrase} {rng.choice(UNITS[unit])}"
            lo, hi = number_range(rng, rng.choice([0, 1, 10, 100]), 5e6)
            return Column(name, rng.choice(["REAL", "REAL", "INTEGER"]), "number", phrase, lo=lo, hi=hi,
                          unit=unit, more_less=more_less)
        elif rng.random() < 0.15:  # "budget" -> "budget in millions"
            phrase = f"{phrase} in millions"
            return Column(name, "REAL", "number", phrase, lo=1, hi=rng.choice([50, 200, 900]))
        lo, hi = number_range(rng, rng.choice([0, 1, 10, 100]), 5e6)
        return Column(name, rng.choice(["REAL", "REAL", "INTEGER"]), "number", phrase, lo=lo, hi=hi,
                      more_less=more_less)
    if role == "rating":
        head = rng.choice(list(RATINGS))
        name, phrase = compose(rng, head, ent)
        lo, hi = RATINGS[head]
        return Column(name, "REAL" if hi <= 10 else "INTEGER", "number", phrase, lo=lo, hi=hi)
    if role == "count":
        what = rng.choice(COUNTS) if rng.random() < 0.6 else plural(piece(rng))
        style = rng.randrange(5)
        name, phrase = [
            (what, what),
            (what, f"number of {what}"),
            (f"num_{what}", f"number of {what}"),
            (f"{what}_count", f"number of {what}"),
            (f"total_{what}", f"total {what}"),
        ][style]
        lo, hi = number_range(rng, rng.choice([0, 1]), 1e5)
        return Column(name, "INTEGER", "number", phrase, lo=lo, hi=hi)
    if role == "year":
        if rng.random() < 0.6:
            name = rng.choice(list(YEARS))
            phrase = rng.choice(YEARS[name])
        else:
            ev = rng.choice(EVENTS)
            name, phrase = f"{ev}_year", f"{ev} year"
        lo = rng.choice([1800, 1900, 1950])
        return Column(name, "INTEGER", "number", phrase, lo=lo, hi=2024)
    ev = rng.choice(EVENTS)
    r = rng.random()
    if r < 0.55:
        name, phrase = f"{ev}_date", f"{ev} date"
    elif r < 0.7:
        name, phrase = f"date_of_{ev}", f"date of {ev}"
    elif r < 0.85:  # "check_in" -> "check-in date"
        name, phrase = ev, f"{ev} date"
    else:  # "filed_date" -> "filing date"
        done, doing = rng.choice(list(EVENT_VERBS.items()))
        name, phrase = f"{done}_date", f"{doing} date"
    lo = rng.choice([1950, 1980, 2000])
    return Column(name, "DATE", "date", phrase, lo=lo, hi=2024)


def make_table(rng: random.Random, banned: frozenset[str], parent: Table | None = None) -> Table:
    """A table with a key, a foreign key to ``parent`` (if given) and 3-7 other columns."""
    while True:
        r = rng.random()
        if parent is not None and rng.random() < 0.2:  # "order" and "order_item", as real schemas do
            words = (parent.ent.split(" ")[:1]
                     + [rng.choice([piece(rng), rng.choice(ENTITIES).split("_")[-1]])])
        elif r < 0.35:
            words = [pseudo_word(rng)]
        elif r < 0.6:
            words = rng.choice(ENTITIES).split("_")
        elif r < 0.85:
            words = [piece(rng), rng.choice([pseudo_word(rng), rng.choice(ENTITIES).split("_")[-1]])]
        else:
            words = [rng.choice(sql_words.WORDS if rng.random() < 0.5 else sql_words.PROSE)]
        sing = "_".join(words)
        plur = "_".join(words[:-1] + [plural(words[-1])])
        name = sing if rng.random() < 0.75 else plur
        if name in banned or {name, sing} & RESERVED:
            continue
        if parent is None or sing != parent.ent.replace(" ", "_"):  # keys and foreign keys would clash
            break
    t = Table(name, sing.replace("_", " "), plur.replace("_", " "))
    t.columns.append(Column(f"{sing}_id" if rng.random() < 0.8 else "id", "INTEGER", "key", "id"))
    if parent is not None:
        psing = parent.ent.replace(" ", "_")
        fk = parent.key.name if parent.key.name != "id" else f"{psing}_id"
        t.columns.append(Column(fk, "INTEGER", "fk", fk.replace("_", " ")))
    while True:
        cols = [make_column(rng, sing) for _ in range(rng.randint(3, 7))]
        names = [c.name for c in cols + t.columns]
        phrases = [c.phrase for c in cols]
        if (
            len(set(names)) == len(names)
            and len(set(phrases)) == len(phrases)
            and not set(names) & RESERVED
            and any(c.textual for c in cols)
            and any(c.numeric for c in cols)
        ):
            t.columns += cols
            return t


# --------------------------------------------------------------------------------------------
# values and conditions
# --------------------------------------------------------------------------------------------
def ordered_value(rng: random.Random, col: Column, lo_q: float = 0.15, hi_q: float = 0.85) -> str:
    """A literal as SQL writes it (dates quoted), between two quantiles of the column's range."""
    u = lo_q + (hi_q - lo_q) * rng.random()
    x = col.lo + u * (col.hi - col.lo)
    if col.type == "DATE":
        return f"'{int(x):04d}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}'"
    if col.type == "REAL" and col.hi - col.lo <= 20:
        return f"{x:.1f}"
    if col.hi - col.lo >= 5000:  # round numbers for large ranges, as people ask
        step = 10 ** (len(str(int(col.hi - col.lo))) - 2)
        return str(int(round(x / step) * step))
    return str(int(round(x)))


def value(rng: random.Random, col: Column) -> str:
    return col.values(rng) if col.textual else ordered_value(rng, col)


def say(rng: random.Random, literal: str) -> str:
    """How a question writes a value: strings bare or double-quoted, dates bare."""
    if literal.startswith("'"):
        v = literal[1:-1].replace("''", "'")
        if re.match(r"^\d{4}-\d\d-\d\d$", v):
            return v
        return f'"{v}"' if rng.random() < 0.3 else v
    return literal


def plural_phrase(phrase: str) -> str:
    """'name' -> 'names' ("Give their names"); phrases with a unit or an 'of' stay as they are."""
    if re.search(r" (in|of|as|per) ", phrase) or phrase.endswith("s"):
        return phrase
    head, _, last = phrase.rpartition(" ")
    return f"{head} {plural(last)}" if head else plural(last)


CMP_WORDS = {
    ">": ["greater than", "more than", "above", "over", "higher than", "larger than"],
    "<": ["less than", "below", "under", "lower than", "smaller than"],
    ">=": ["at least", "no less than", "greater than or equal to"],
    "<=": ["at most", "no more than", "less than or equal to"],
}
DATE_CMP_WORDS = {
    ">": ["after", "later than"],
    "<": ["before", "earlier than"],
    ">=": ["on or after"],
    "<=": ["on or before"],
}
AGG_WORDS = {
    "AVG": ["average", "mean"],
    "MIN": ["minimum", "lowest", "smallest"],
    "MAX": ["maximum", "highest", "largest"],
    "SUM": ["total", "combined", "sum of the"],
}


@dataclass
class Cond:
    sql: str
    rel: str  # "whose height is above 30"
    has: str  # "have a height above 30"
    cols: set[Column]
    place: bool = False  # rel is "in Cornwall": it can lead another condition without "and"


def cond(
    rng: random.Random, kind: str, col: Column, phrase: str | None = None, ref: str = "", owner: str = "",
    lone: bool = False,
) -> Cond | None:
    """A WHERE condition of one kind on ``col`` (written ``ref + name``), said with ``phrase``;
    ``owner``: the joined table's entity, for "whose vessel has flag Italy"; ``lone``: no other
    column of the table is a place (if ``col`` is one) or has ``col``'s comparatives, so that
    "lighthouses in Cornwall" or "taller than 30 metres" can only mean ``col``."""
    p, c = phrase or col.phrase, ref + col.name
    if kind in ("eq", "neq"):
        lit = col.values(rng)
        v = say(rng, lit)
        if kind == "eq" and lone and col.place and rng.random() < 0.5:
            where = rng.choice(["in", "in", "located in", "based in"])
            return Cond(f"{c} = {lit}", f"{where} {v}", rng.choice([f"are in {v}", f"are located in {v}"]),
                        {col}, place=True)
        if kind == "eq":
            rel = [
                f"whose {p} is {v}",
                f"with {p} {v}",
                f"where the {p} is {v}",
                f"that have {p} {v}",
                f"having a {p} of {v}",
                f"where {p} equals {v}",
            ] + ([f"whose {owner} has {col.phrase} {v}"] if owner else [])
            return Cond(
                f"{c} = {lit}", rng.choice(rel), rng.choice([f"have {p} {v}", f"have a {p} of {v}"]), {col}
            )
        rel = [
            f"whose {p} is not {v}",
            f"with a {p} other than {v}",
            f"whose {p} is different from {v}",
            f"except those with {p} {v}",
        ]
        return Cond(f"{c} != {lit}", rng.choice(rel), f"do not have {p} {v}", {col})
    if kind == "cmp":
        op = rng.choice([">", "<", ">=", "<="])
        lit = ordered_value(rng, col)
        w, v = rng.choice((DATE_CMP_WORDS if col.type == "DATE" else CMP_WORDS)[op]), say(rng, lit)
        if lone and col.more_less and op in (">", "<") and rng.random() < 0.45:  # "taller than 30 metres"
            adj = col.more_less[op == "<"]
            if col.unit and rng.random() < 0.8:
                v = f"{v} {rng.choice(NUMBER_UNITS[col.unit])}"
            rel = rng.choice([f"that are {adj} than {v}", f"{adj} than {v}", f"which are {adj} than {v}"])
            return Cond(f"{c} {op} {lit}", rel, f"are {adj} than {v}", {col})
        rel = [
            f"whose {p} is {w} {v}",
            f"with a {p} {w} {v}",
            f"where the {p} is {w} {v}",
            f"with {p} {w} {v}",
        ] + ([f"whose {owner} has a {col.phrase} {w} {v}"] if owner else [])
        return Cond(
            f"{c} {op} {lit}",
            rng.choice(rel),
            rng.choice([f"have a {p} {w} {v}", f"have {p} {w} {v}"]),
            {col},
        )
    if kind == "between":
        lo, hi = ordered_value(rng, col, 0.0, 0.45), ordered_value(rng, col, 0.55, 1.0)
        x, y = say(rng, lo), say(rng, hi)
        rel = [
            f"whose {p} is between {x} and {y}",
            f"with {p} from {x} to {y}",
            f"with a {p} in the range {x} to {y}",
            f"with {p} between {x} and {y}",
        ]
        has = rng.choice([f"have a {p} between {x} and {y}", f"have a {p} from {x} to {y}"])
        return Cond(f"{c} BETWEEN {lo} AND {hi}", rng.choice(rel), has, {col})
    if kind == "or":
        l1, l2 = col.values(rng), col.values(rng)
        if l1 == l2:
            return None
        s1, s2 = say(rng, l1), say(rng, l2)
        rel = [
            f"whose {p} is {s1} or {s2}",
            f"with {p} either {s1} or {s2}",
            f"where {p} is {s1} or {p} is {s2}",
            f"whose {p} is either {s1} or {s2}",
            f"with {p} {s1} or {s2}",
        ]
        return Cond(f"{c} = {l1} OR {c} = {l2}", rng.choice(rel), f"have {p} {s1} or {s2}", {col})
    # like: a name that starts with, ends with or contains a piece
    v = col.values(rng)[1:-1].replace("''", "'")
    how = rng.choice(["start", "end", "contain"])
    if how == "start":
        s = v[: rng.randint(1, 3)]
        pat, rel = f"{s}%", [f"whose {p} starts with '{s}'", f"with a {p} beginning with '{s}'"]
        has = f"have a {p} starting with '{s}'"
    elif how == "end":
        s = v[-rng.randint(2, 3) :]
        pat, rel = f"%{s}", [f"whose {p} ends with '{s}'", f"with a {p} ending in '{s}'"]
        has = f"have a {p} ending in '{s}'"
    else:
        words = v.split()
        s = rng.choice(words) if len(words) > 1 else v[1:4]
        pat, rel = f"%{s}%", [f"whose {p} contains '{s}'", f"with '{s}' in their {p}"]
        has = f"have a {p} containing '{s}'"
    return Cond(f"{c} LIKE {q(pat)}", rng.choice(rel), has, {col})


COND_COLS = {
    "eq": lambda c: c.textual,
    "neq": lambda c: c.categorical,
    "cmp": lambda c: c.ordered,
    "between": lambda c: c.ordered,
    "or": lambda c: c.textual,
    "like": lambda c: c.namelike,
}


def pick(
    rng: random.Random, cols: list[Column], pred: Callable[[Column], bool], n: int = 1, exclude=()
) -> list[Column] | None:
    cand = [c for c in cols if pred(c) and c not in exclude and not c.is_key]
    return rng.sample(cand, n) if len(cand) >= n else None


def any_col(c: Column) -> bool:
    return True


def some_cond(
    rng: random.Random, kind: str, t: Table, exclude=(), phrase=None, ref: str = "", owner: str = ""
) -> Cond | None:
    """A condition of ``kind`` on a fitting column of ``t`` (``and``: two conditions, two columns)."""
    if kind == "and":
        k1, k2 = rng.choice(["eq", "cmp"]), rng.choice(["eq", "cmp"])
        a = some_cond(rng, k1, t, exclude, phrase, ref, owner)
        b = a and some_cond(rng, k2, t, tuple(exclude) + tuple(a.cols), phrase, ref, owner)
        if not b:
            return None
        if b.place and not a.place:  # the place first: "lighthouses in Cornwall taller than 30 metres"
            a, b = b, a
        if a.place and not b.place and rng.random() < 0.7:
            return Cond(f"{a.sql} AND {b.sql}", f"{a.rel} {b.rel}", f"{a.rel} {b.has}", a.cols | b.cols)
        rel2 = (
            b.rel if rng.random() < 0.5 else re.sub(r"^(whose|with|where the|that have|having) ", "", b.rel)
        )
        return Cond(f"{a.sql} AND {b.sql}", f"{a.rel} and {rel2}", f"{a.has} and {b.has}", a.cols | b.cols)
    col = pick(rng, t.columns, COND_COLS[kind], exclude=exclude)
    if not col:
        return None
    c = col[0]
    lone = not ref and (
        (c.place and sum(o.place for o in t.columns) == 1)
        or (c.more_less is not None and [o.more_less for o in t.columns].count(c.more_less) == 1))
    return cond(rng, kind, c, phrase(c) if phrase else None, ref, owner, lone)


# --------------------------------------------------------------------------------------------
# query forms: a builder gives (fields, sql, {table: columns the query needs}); the question is
# one of the form's phrasings filled with the fields
# --------------------------------------------------------------------------------------------
SELECT_T = [
    "What is the {a} of the {ents} {cond}?",
    "Find the {a} of {ents} {cond}.",
    "List the {a} of all {ents} {cond}.",
    "Show the {a} for {ents} {cond}.",
    "Which {ents} {has}? Give their {as}.",
    "Give the {a} of every {ent} {cond}.",
    "Return the {a} of each {ent} {cond}.",
    "What are the {as} of the {ents} {cond}?",
    "What is the {a} of {ents} {cond}?",
    "What is the {a} of the {ent} {cond}?",
    "What are the {a} values of {ents} {cond}?",
    "Which {ents} {has}? Give their {a}.",
    "Which {ents} {has}? Show their {a}.",
    "List the {a} of {ents} {cond}.",
    "Show the {a} of every {ent} {cond}.",
    "Find the {a} for {ents} {cond}.",
]
WHICH_T = [  # the answer is the table's label column: its name or title
    "Which {ents} {has}?",
    "What {ents} {has}?",
    "Which of the {ents} {has}?",
    "Which {ents} {has}? List them.",
    "Which {ents} {has}? Name them.",
    "Tell me which {ents} {has}.",
]
SELECT2_T = [
    "What are the {a} and {a2} of {ents} {cond}?",
    "List the {a} and {a2} of the {ents} {cond}.",
    "Show the {a} and {a2} for every {ent} {cond}.",
    "Which {ents} {has}? Give their {as} and {a2s}.",
    "Give the {a} together with the {a2} of {ents} {cond}.",
    "Find the {a} and the {a2} of all {ents} {cond}.",
]
ALL_T = [
    "List the {a} of all {ents}.",
    "What are the {as} of the {ents}?",
    "Show the {a} of every {ent}.",
    "Give the {as} of all {ents}.",
    "Return the {a} of each {ent}.",
    "What {a} does each {ent} have?",
]
ALL2_T = [
    "List the {a} and {a2} of all {ents}.",
    "What are the {a} and {a2} of every {ent}?",
    "Show the {a} and {a2} of each {ent}.",
    "Give the {as} and {a2s} of the {ents}.",
    "For every {ent}, list its {a} and {a2}.",
    "Return the {a} and {a2} of all {ents}.",
]
COUNT_ALL_T = [
    "How many {ents} are there?",
    "Count the number of {ents}.",
    "What is the total number of {ents}?",
    "How many {ents} do we have?",
    "Give the number of {ents}.",
    "Find the count of all {ents}.",
    "How many {ents} are there in total?",
    "How many {ents} exist?",
]
COUNT_T = [
    "How many {ents} {has}?",
    "How many {ents} are there {cond}?",
    "Count the {ents} {cond}.",
    "What is the number of {ents} {cond}?",
    "Give the number of {ents} {cond}.",
    "How many {ents} {cond} are there in total?",
    "Find how many {ents} {has}.",
]
AGG_T = [
    "What is the {w} {c} of all {ents}{cond}?",
    "What is the {w} {c} of {ents}{cond}?",
    "Find the {w} {c} across all {ents}{cond}.",
    "Give the {w} {c} of the {ents}{cond}.",
    "Show the {w} {c} among {ents}{cond}.",
    "Compute the {w} {c} for {ents}{cond}.",
    "For {ents}{cond}, what is the {w} {c}?",
    "Find the {w} {c} among the {ents}{cond}.",
]
TOTAL_T = [
    "What is the total {c} of all {ents}{cond}?",
    "How much {c} do the {ents}{cond} have in total?",
    "What is the {c} of all {ents}{cond} in total?",
    "Give the combined {c} of the {ents}{cond}.",
    "Sum the {c} of the {ents}{cond}.",
    "What do the {c} values of the {ents}{cond} add up to?",
    "In total, what is the {c} of the {ents}{cond}?",
]
MINMAX_T = [
    "What are the maximum and minimum {c} of {ents}?",
    "Give the highest and lowest {c} among {ents}.",
    "Find the largest and smallest {c} of all {ents}.",
    "Show the maximum and the minimum {c} across all {ents}.",
    "What is the highest and the lowest {c} of the {ents}?",
    "Return the max and min {c} of all {ents}.",
]
STATS_T = [
    "What are the average, minimum, and maximum {c} of {ents}?",
    "Show the mean, lowest and highest {c} across all {ents}.",
    "Give the average, smallest and largest {c} of the {ents}.",
    "Find the average, minimum and maximum {c} among all {ents}.",
    "What is the mean, the minimum and the maximum {c} of {ents}?",
    "Return the average, lowest and highest {c} for every {ent}.",
]
TOP1_T = [
    "What is the {a} of the {ent} with the {w} {b}?",
    "Which {ent} has the {w} {b}? Give its {a}.",
    "Find the {a} of the {ent} that has the {w} {b}.",
    "Give the {a} of the {ent} whose {b} is the {w}.",
    "Show the {a} of the {ent} with the {w} {b}.",
    "Return the {a} for the {ent} having the {w} {b}.",
    "Which {a} belongs to the {ent} with the {w} {b}?",
    "Find the {a} for the {ent} that has the {w} {b}.",
]
TOPK_T = [
    "List the {a} of the {k} {ents} with the {w} {b}.",
    "What are the {as} of the {k} {ents} that have the {w} {b}?",
    "Show the {a} of the {k} {ents} with the {w} {b}.",
    "Give the {as} of the {k} {ents} whose {b} is the {w}.",
    "Which {k} {ents} have the {w} {b}? Give their {as}.",
    "Find the {a} for the {k} {ents} having the {w} {b}.",
    "What are the {a} values of the top {k} {ents} by {w} {b}?",
    "Show the {a} of the {k} {ents} that have the {w} {b}.",
]
ORDER_T = [
    "List the {a} of all {ents} sorted by {b} {w}.",
    "Show the {a} of {ents} ordered by {b} {w}.",
    "Sort the {ents} by {b} {w} and list their {as}.",
    "Give the {as} of the {ents}, ordered by {b} {w}.",
    "What are the {as} of all {ents} when sorted by {b} {w}?",
    "Return the {a} of every {ent}, sorted by {b} {w}.",
    "Sort the {ents} by {b} {w} and list their {a}.",
]
GROUP_COUNT_T = [
    "How many {ents} are there for each {b}?",
    "Show each {b} and the number of {ents}.",
    "Count the {ents} for every {b}.",
    "For every {b}, how many {ents} are there?",
    "List each {b} with its number of {ents}.",
    "What is the number of {ents} per {b}?",
    "Count the {ents} in each {b}.",
    "Show each {b} and the number of {ents} it has.",
]
GROUP_AGG_T = [
    "What is the {w} {c} of {ents} for each {b}?",
    "Show each {b} together with the {w} {c} of its {ents}.",
    "For every {b}, find the {w} {c} of the {ents}.",
    "List each {b} and the {w} {c} of its {ents}.",
    "Give the {w} {c} of the {ents} per {b}.",
    "What is the {w} {c} for every {b} of the {ents}?",
]
HAVING_T = [
    "Which {b} values have {w} {k} {ents}?",
    "List the {b} shared by {w} {k} {ents}.",
    "Find every {b} with {w} {k} {ents}.",
    "Which {bs} have {w} {k} {ents}?",
    "Show the {b} values that appear in {w} {k} {ents}.",
    "Give each {b} held by {w} {k} {ents}.",
]
GROUP_TOP_T = [
    "Which {b} has the {w} {ents}?",
    "What is the {b} with the {w} {ents}?",
    "Find the {b} that has the {w} {ents}.",
    "Give the {b} shared by the {w} {ents}.",
    "Show the {b} with the {w} {ents}.",
    "Return the {b} having the {w} {ents}.",
    "Find the {b} that appears among the {ents} the {w} times.",
]
GROUP_SUM_T = [
    "Which {b} has the {w} {c} in total?",
    "Which {b} has the {w2} total {c}?",
    "What is the {b} whose {ents} have the {w} {c} in total?",
    "Find the {b} with the {w2} sum of {c}.",
    "Give the {b} with the {w2} combined {c}.",
    "Which {b} has the {w} {c}?",
]
DISTINCT_T = [
    "What are the distinct {b} values of {ents}{cond}?",
    "List the different {b} values among {ents}{cond}.",
    "Show all unique {b} values of the {ents}{cond}.",
    "Which {bs} do the {ents}{cond} have?",
    "Give the distinct {bs} of {ents}{cond}.",
    "What different {bs} are there among {ents}{cond}?",
]
COUNT_DISTINCT_T = [
    "How many different {b} values are there among {ents}?",
    "How many distinct {bs} do the {ents} have?",
    "Count the number of unique {b} values of {ents}.",
    "What is the number of different {bs} of the {ents}?",
    "Give the count of distinct {b} values among all {ents}.",
    "How many unique {bs} are there for {ents}?",
]
STAR_T = [
    "Show all information about {ents} {cond}.",
    "Give me every detail of the {ents} {cond}.",
    "Return all columns for {ents} {cond}.",
    "List everything about the {ents} {cond}.",
    "What are all the details of {ents} {cond}?",
    "Show every column of the {ents} {cond}.",
]
PAIR_T = [
    "List the {a} of each {ent} together with its {pc}.",
    "Show the {a} and {pc} of every {ent}.",
    "For each {ent}, give its {a} and the {c} of its {parent}.",
    "What is the {a} and the {pc} of each {ent}?",
    "Give every {ent}'s {a} with its {pc}.",
    "Return the {a} of all {ents} along with their {pc}.",
]
PARENT_TOP_T = [
    "Which {parent} has the most {ents}? Give its {c}.",
    "What is the {pc} of the {parent} with the most {ents}?",
    "Find the {pc} that has the most {ents}.",
    "Which {pc} has the largest number of {ents}?",
    "Give the {pc} of the {parent} with the greatest number of {ents}.",
    "Return the {pc} having the most {ents}.",
]

Built = tuple[dict, str, dict]  # (fields, sql, {table: needed columns})


def names(t: Table, **cols: Column) -> dict:
    """The fields of a question about ``t``: entity words, and each column's phrase and its plural."""
    f = {"ent": t.ent, "ents": t.ents}
    for k, c in cols.items():
        f[k], f[k + "s"] = c.phrase, plural_phrase(c.phrase)
    return f


def b_select(kind: str) -> Callable[[random.Random, Table], Built | None]:
    def build(rng, t):
        cd = some_cond(rng, kind, t)
        a = cd and pick(rng, t.columns, any_col, exclude=cd.cols)
        if not a:
            return None
        return (
            {**names(t, a=a[0]), "cond": cd.rel, "has": cd.has},
            f"SELECT {a[0].name} FROM {t.name} WHERE {cd.sql}",
            {t: cd.cols | {a[0]}},
        )

    return build


def b_which(rng, t):
    label_names = ("name", "title", f"{t.key.name[:-3]}_name", f"{t.ent.replace(' ', '_')}_name")
    labels = [c for c in t.columns if c.name in label_names]
    if not labels:
        return None
    cd = some_cond(rng, rng.choice(["eq", "cmp", "and", "and"]), t, exclude=labels)
    if not cd:
        return None
    return ({**names(t), "has": cd.has}, f"SELECT {labels[0].name} FROM {t.name} WHERE {cd.sql}",
            {t: cd.cols | {labels[0]}})


def b_select2(rng, t):
    cd = some_cond(rng, rng.choice(["eq", "cmp"]), t)
    a = cd and pick(rng, t.columns, any_col, n=2, exclude=cd.cols)
    if not a:
        return None
    return (
        {**names(t, a=a[0], a2=a[1]), "cond": cd.rel, "has": cd.has},
        f"SELECT {a[0].name}, {a[1].name} FROM {t.name} WHERE {cd.sql}",
        {t: cd.cols | set(a)},
    )


def b_all(n: int) -> Callable[[random.Random, Table], Built | None]:
    def build(rng, t):
        a = pick(rng, t.columns, any_col, n=n)
        if not a:
            return None
        cols = dict(zip(("a", "a2"), a))
        return names(t, **cols), f"SELECT {', '.join(c.name for c in a)} FROM {t.name}", {t: set(a)}

    return build


def b_count_all(rng, t):
    return names(t), f"SELECT COUNT(*) FROM {t.name}", {t: set()}


def b_count(kind: str):
    def build(rng, t):
        cd = some_cond(rng, kind, t)
        if not cd:
            return None
        return (
            {**names(t), "cond": cd.rel, "has": cd.has},
            f"SELECT COUNT(*) FROM {t.name} WHERE {cd.sql}",
            {t: cd.cols},
        )

    return build


def b_agg(where: bool, fns=tuple(AGG_WORDS)):
    def build(rng, t):
        c = pick(rng, t.columns, lambda c: c.numeric)
        if not c:
            return None
        c = c[0]
        cd = some_cond(rng, rng.choice(["eq", "cmp"]), t, exclude=(c,)) if where else None
        if where and not cd:
            return None
        fn = rng.choice(fns)
        sql = f"SELECT {fn}({c.name}) FROM {t.name}" + (f" WHERE {cd.sql}" if cd else "")
        return (
            {**names(t, c=c), "w": rng.choice(AGG_WORDS[fn]), "cond": f" {cd.rel}" if cd else ""},
            sql,
            {t: {c} | (cd.cols if cd else set())},
        )

    return build


def b_minmax(fns: str):
    def build(rng, t):
        c = pick(rng, t.columns, lambda c: c.numeric)
        if not c:
            return None
        return (
            names(t, c=c[0]),
            f"SELECT {', '.join(f'{fn}({c[0].name})' for fn in fns.split())} FROM {t.name}",
            {t: {c[0]}},
        )

    return build


def order_words(rng, col: Column, desc: bool) -> str:
    if col.type == "DATE":
        return rng.choice(["latest", "most recent"]) if desc else rng.choice(["earliest", "oldest"])
    return rng.choice(["highest", "largest", "greatest"]) if desc else rng.choice(["lowest", "smallest"])


def b_top(k: bool):
    def build(rng, t):
        b = pick(rng, t.columns, lambda c: c.ordered)
        a = b and pick(rng, t.columns, any_col, exclude=b)
        if not a:
            return None
        desc = rng.random() < 0.6
        n = rng.randint(2, 10)
        order = f"ORDER BY {b[0].name}{' DESC' if desc else ''} LIMIT {n if k else 1}"
        sql = f"SELECT {a[0].name} FROM {t.name} {order}"
        return {**names(t, a=a[0], b=b[0]), "w": order_words(rng, b[0], desc), "k": n}, sql, {t: {a[0], b[0]}}

    return build


def b_order(rng, t):
    b = pick(rng, t.columns, lambda c: c.ordered or c.textual)
    a = b and pick(rng, t.columns, any_col, exclude=b)
    if not a:
        return None
    desc = rng.random() < 0.5
    w = rng.choice(
        ["in descending order", "from highest to lowest", "in decreasing order"]
        if desc
        else ["in ascending order", "from lowest to highest", "in increasing order"]
    )
    sql = f"SELECT {a[0].name} FROM {t.name} ORDER BY {b[0].name}{' DESC' if desc else ''}"
    return {**names(t, a=a[0], b=b[0]), "w": w}, sql, {t: {a[0], b[0]}}


def b_group_count(rng, t):
    b = pick(rng, t.columns, lambda c: c.categorical)
    if not b:
        return None
    return names(t, b=b[0]), f"SELECT {b[0].name}, COUNT(*) FROM {t.name} GROUP BY {b[0].name}", {t: {b[0]}}


def b_group_agg(rng, t):
    b = pick(rng, t.columns, lambda c: c.categorical)
    c = pick(rng, t.columns, lambda c: c.numeric)
    if not b or not c:
        return None
    fn = rng.choice(list(AGG_WORDS))
    sql = f"SELECT {b[0].name}, {fn}({c[0].name}) FROM {t.name} GROUP BY {b[0].name}"
    return {**names(t, b=b[0], c=c[0]), "w": rng.choice(AGG_WORDS[fn])}, sql, {t: {b[0], c[0]}}


def b_having(rng, t):
    b = pick(rng, t.columns, lambda c: c.categorical)
    if not b:
        return None
    k = rng.randint(1, 20)
    op, w = (">", rng.choice(["more than", "over"])) if rng.random() < 0.6 else (">=", "at least")
    sql = f"SELECT {b[0].name} FROM {t.name} GROUP BY {b[0].name} HAVING COUNT(*) {op} {k}"
    return {**names(t, b=b[0]), "w": w, "k": k}, sql, {t: {b[0]}}


def b_group_top(rng, t):
    b = pick(rng, t.columns, lambda c: c.categorical)
    if not b:
        return None
    most = rng.random() < 0.7
    sql = (
        f"SELECT {b[0].name} FROM {t.name} GROUP BY {b[0].name} ORDER BY COUNT(*)"
        f"{' DESC' if most else ''} LIMIT 1"
    )
    return {**names(t, b=b[0]), "w": "most" if most else "fewest"}, sql, {t: {b[0]}}


def b_group_sum_top(rng, t):
    b = pick(rng, t.columns, lambda c: c.categorical)
    c = pick(rng, t.columns, lambda c: c.numeric)
    if not b or not c:
        return None
    most = rng.random() < 0.75
    sql = (
        f"SELECT {b[0].name} FROM {t.name} GROUP BY {b[0].name} ORDER BY SUM({c[0].name})"
        f"{' DESC' if most else ''} LIMIT 1"
    )
    fields = {"w": "most" if most else "least", "w2": "highest" if most else "lowest"}
    return {**names(t, b=b[0], c=c[0]), **fields}, sql, {t: {b[0], c[0]}}


def b_distinct(rng, t):
    b = pick(rng, t.columns, lambda c: c.categorical or c.namelike)
    if not b:
        return None
    cd = some_cond(rng, "cmp", t, exclude=b) if rng.random() < 0.4 else None
    sql = f"SELECT DISTINCT {b[0].name} FROM {t.name}" + (f" WHERE {cd.sql}" if cd else "")
    return (
        {**names(t, b=b[0]), "cond": f" {cd.rel}" if cd else ""},
        sql,
        {t: {b[0]} | (cd.cols if cd else set())},
    )


def b_count_distinct(rng, t):
    b = pick(rng, t.columns, lambda c: c.categorical or c.namelike)
    if not b:
        return None
    return names(t, b=b[0]), f"SELECT COUNT(DISTINCT {b[0].name}) FROM {t.name}", {t: {b[0]}}


def b_star(rng, t):
    cd = some_cond(rng, "eq", t)
    if not cd:
        return None
    return {**names(t), "cond": cd.rel}, f"SELECT * FROM {t.name} WHERE {cd.sql}", {t: cd.cols}


# ---- joins: the child (with the foreign key) is T1, the parent T2 ----------------------------
def parent_phrase(parent: Table, c: Column) -> str:
    """How a question names a parent's column: 'vessel flag', or 'vessel name' for 'vessel_name'."""
    return c.phrase if c.phrase.startswith(parent.ent) else f"{parent.ent} {c.phrase}"


def join_on(parent: Table, child: Table) -> tuple[Column, str]:
    fk = next(c for c in child.columns if c.role == "fk")
    return fk, f"FROM {child.name} AS T1 JOIN {parent.name} AS T2 ON T1.{fk.name} = T2.{parent.key.name}"


def b_join_select(kind: str):
    def build(rng, parent, child):
        fk, on = join_on(parent, child)
        cd = some_cond(
            rng, kind, parent, phrase=lambda c: parent_phrase(parent, c), ref="T2.", owner=parent.ent
        )
        a = cd and pick(rng, child.columns, any_col)
        if not a:
            return None
        return (
            {**names(child, a=a[0]), "cond": cd.rel, "has": cd.has},
            f"SELECT T1.{a[0].name} {on} WHERE {cd.sql}",
            {child: {a[0], fk}, parent: cd.cols | {parent.key}},
        )

    return build


def b_join_pair(rng, parent, child):
    fk, on = join_on(parent, child)
    a, c = pick(rng, child.columns, any_col), pick(rng, parent.columns, any_col)
    if not a or not c:
        return None
    fields = {**names(child, a=a[0], c=c[0]), "pc": parent_phrase(parent, c[0]), "parent": parent.ent}
    return (
        fields,
        f"SELECT T1.{a[0].name}, T2.{c[0].name} {on}",
        {child: {a[0], fk}, parent: {parent.key, c[0]}},
    )


def b_join_group(rng, parent, child):
    fk, on = join_on(parent, child)
    c = pick(rng, parent.columns, lambda c: c.textual)
    if not c:
        return None
    return (
        {**names(child), "b": parent_phrase(parent, c[0])},
        f"SELECT T2.{c[0].name}, COUNT(*) {on} GROUP BY T2.{c[0].name}",
        {child: {fk}, parent: {parent.key, c[0]}},
    )


def b_join_agg(rng, parent, child):
    fk, on = join_on(parent, child)
    n = pick(rng, child.columns, lambda c: c.numeric)
    cd = some_cond(
        rng,
        rng.choice(["eq", "cmp"]),
        parent,
        phrase=lambda c: parent_phrase(parent, c),
        ref="T2.",
        owner=parent.ent,
    )
    if not n or not cd:
        return None
    fn = rng.choice(list(AGG_WORDS))
    return (
        {**names(child, c=n[0]), "w": rng.choice(AGG_WORDS[fn]), "cond": f" {cd.rel}"},
        f"SELECT {fn}(T1.{n[0].name}) {on} WHERE {cd.sql}",
        {child: {n[0], fk}, parent: cd.cols | {parent.key}},
    )


def b_join_top(rng, parent, child):
    fk, on = join_on(parent, child)
    c = pick(rng, parent.columns, lambda c: c.textual)
    b = pick(rng, child.columns, lambda c: c.ordered)
    if not c or not b:
        return None
    desc = rng.random() < 0.6
    fields = {**names(child, b=b[0]), "a": parent_phrase(parent, c[0]), "w": order_words(rng, b[0], desc)}
    sql = f"SELECT T2.{c[0].name} {on} ORDER BY T1.{b[0].name}{' DESC' if desc else ''} LIMIT 1"
    return fields, sql, {child: {b[0], fk}, parent: {parent.key, c[0]}}


def b_join_parent_top(rng, parent, child):
    fk, on = join_on(parent, child)
    c = pick(rng, parent.columns, lambda c: c.textual)
    if not c:
        return None
    fields = {**names(child, c=c[0]), "pc": parent_phrase(parent, c[0]), "parent": parent.ent}
    sql = f"SELECT T2.{c[0].name} {on} GROUP BY T1.{fk.name} ORDER BY COUNT(*) DESC LIMIT 1"
    return fields, sql, {child: {fk}, parent: {parent.key, c[0]}}


@dataclass(frozen=True)
class Form:
    build: Callable[..., Built | None]
    phrasings: list[str]
    weight: float
    join: bool = False


FORMS: dict[str, Form] = {
    "select_eq": Form(b_select("eq"), SELECT_T, 3),
    "select_cmp": Form(b_select("cmp"), SELECT_T, 2.5),
    "select_and": Form(b_select("and"), SELECT_T, 2.5),
    "select_or": Form(b_select("or"), SELECT_T, 1),
    "select_neq": Form(b_select("neq"), SELECT_T, 1),
    "select_like": Form(b_select("like"), SELECT_T, 1.5),
    "select_between": Form(b_select("between"), SELECT_T, 1.5),
    "select2": Form(b_select2, SELECT2_T, 2),
    "which": Form(b_which, WHICH_T, 1.5),
    "all": Form(b_all(1), ALL_T, 0.7),
    "all2": Form(b_all(2), ALL2_T, 0.7),
    "count_all": Form(b_count_all, COUNT_ALL_T, 1),
    "count_eq": Form(b_count("eq"), COUNT_T, 2),
    "count_cmp": Form(b_count("cmp"), COUNT_T, 1.5),
    "count_and": Form(b_count("and"), COUNT_T, 1.5),
    "agg": Form(b_agg(False), AGG_T, 2),
    "agg_where": Form(b_agg(True), AGG_T, 2),
    "total": Form(b_agg(False, ("SUM",)), TOTAL_T, 1),
    "total_where": Form(b_agg(True, ("SUM",)), TOTAL_T, 1),
    "minmax": Form(b_minmax("MAX MIN"), MINMAX_T, 0.7),
    "stats": Form(b_minmax("AVG MIN MAX"), STATS_T, 0.5),
    "top1": Form(b_top(False), TOP1_T, 2),
    "topk": Form(b_top(True), TOPK_T, 1.5),
    "order": Form(b_order, ORDER_T, 1.5),
    "group_count": Form(b_group_count, GROUP_COUNT_T, 1.5),
    "group_agg": Form(b_group_agg, GROUP_AGG_T, 1.5),
    "having": Form(b_having, HAVING_T, 1),
    "group_top": Form(b_group_top, GROUP_TOP_T, 1),
    "group_sum_top": Form(b_group_sum_top, GROUP_SUM_T, 1),
    "distinct": Form(b_distinct, DISTINCT_T, 1.5),
    "count_distinct": Form(b_count_distinct, COUNT_DISTINCT_T, 1),
    "star": Form(b_star, STAR_T, 1),
    "join_eq": Form(b_join_select("eq"), SELECT_T, 2, True),
    "join_cmp": Form(b_join_select("cmp"), SELECT_T, 1.5, True),
    "join_select": Form(b_join_pair, PAIR_T, 1.5, True),
    "join_group": Form(b_join_group, GROUP_COUNT_T, 1.5, True),
    "join_agg": Form(b_join_agg, AGG_T, 1.5, True),
    "join_top": Form(b_join_top, TOP1_T, 1, True),
    "join_parent_top": Form(b_join_parent_top, PARENT_TOP_T, 1, True),
}


# --------------------------------------------------------------------------------------------
# examples
# --------------------------------------------------------------------------------------------
def create_table(rng: random.Random, t: Table, needed: set[Column]) -> str:
    """``CREATE TABLE`` with the needed columns plus a random number of the others, in some order."""
    others = [c for c in t.columns if c not in needed]
    chosen = set(needed) | set(rng.sample(others, rng.randint(max(0, 3 - len(needed)), len(others))))
    cols = [c for c in t.columns if c in chosen]
    if rng.random() < 0.5:  # shuffle all but a leading key
        head = cols[:1] if cols and cols[0].role == "key" else []
        tail = cols[len(head) :]
        rng.shuffle(tail)
        cols = head + tail
    return f"CREATE TABLE {t.name} ({', '.join(f'{c.name} {c.type}' for c in cols)});"


def example(rng: random.Random, banned: frozenset[str]) -> dict | None:
    """One example on a fresh schema (a parent table and its child), or None if the form did not fit."""
    parent = make_table(rng, banned)
    tables = [parent, make_table(rng, banned | {parent.name}, parent)]
    name = rng.choices(list(FORMS), [f.weight for f in FORMS.values()])[0]
    form = FORMS[name]
    built = form.build(rng, *tables) if form.join else form.build(rng, rng.choice(tables))
    if built is None:
        return None
    fields, sql, needed = built
    i = rng.randrange(len(form.phrasings))
    question = form.phrasings[i].format(**fields)
    question = question[0].upper() + question[1:]
    used = [t for t in tables if t in needed]
    if not form.join and rng.random() < 0.15:  # the other table, as a distractor
        used = tables
    ctx = [create_table(rng, t, needed.get(t, set())) for t in used]
    if len(ctx) > 1 and rng.random() < 0.5:
        ctx.reverse()
    return {
        "prompt": sql_prompt("\n".join(ctx), question),
        "completion": sql,
        "meta": {"domain": "proc", "form": name, "phrasing": i},
    }


def examples(seed: int | str, held: HeldOut | None = None) -> Iterator[dict]:
    """Endless examples determined by ``seed``; none has a held-out prompt or table name."""
    held = held or held_out()
    rng = random.Random(f"sqlgen-{seed}")
    while True:
        ex = example(rng, held.tables)
        if ex is not None and ex["prompt"] not in held.prompts:
            yield ex


def train_split(n: int, seed: int) -> list[dict]:
    """The first n examples of ``examples(seed)`` with distinct prompts, each checked in sqlite3."""
    out, seen = [], set()
    for ex in examples(f"train-{seed}"):
        if ex["prompt"] in seen:
            continue
        check_sql(ex)
        seen.add(ex["prompt"])
        out.append(ex)
        if len(out) == n:
            return out
    raise AssertionError("unreachable")
