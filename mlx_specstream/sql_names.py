"""SQL that names only what its schema has: a token constraint under which generated SQL may use
as identifiers only the tables and columns of the prompt's ``CREATE TABLE`` statements, SQL's
keywords and functions, and aliases (docs/design.md#constrained-decoding).

Why: most wrong SQL of a small model writes a name the schema lacks (``created`` for
``year_created``, ``cioations`` for ``citations``, ``T1.power_plant`` for ``T1.plant_id``). The
constraint cannot make a wrong column right, but it stops a name that does not exist.

The text generated so far is read left to right. Outside quotes a *word* is a run of letters,
digits and ``_``. A word that is finished (a non-word character follows it, or the text ends)
must be one of:

- a number (it starts with a digit);
- a word of queries and data changes or a function (:data:`SQL_WORDS`; not ``create``, ``drop``
  or ``constraint``, which only define a schema), in lower or upper case; a table or column name
  of the schema, spelt as the schema spells it (``gpa``, not ``gPA``);
- an alias: any word right after ``AS`` or ``WITH [RECURSIVE]`` (the first common table
  expression's name; later ones of a list are not told apart from other words after a comma), a
  word of at most three letters and optional digits right after a table name that follows
  ``FROM`` or ``JOIN`` (``FROM flight f``), and one letter with optional digits anywhere
  (``T1``), since a query names its aliases (``SELECT T1.name``) before it defines them
  (``AS T1``);
- after ``Q.``: a column of Q's table, where Q is a table or an alias defined by then (any column
  while Q is an alias still to be defined).

A word being written must be the beginning of such a word; outside quotes, of one that needs no
quotes (``"Order Items"`` cannot be begun bare). A name such as ``café`` can be written whether
the tokenizer writes ``é`` as one piece or as byte tokens (:class:`~.constraint.CharConstraint`
puts bytes together into characters). Text in single quotes (a string literal)
is free; between words only spaces and SQL's operators and punctuation may come; a
name in double quotes, backticks or brackets must be a name. The end of generation (EOS) is
allowed only outside quotes and after a finished word that is allowed.

Example (``CREATE TABLE lighthouse (name TEXT, county TEXT, height_m INTEGER)``): after
``SELECT na`` the piece ``me`` is allowed (``name``), ``ughty`` is not; after
``SELECT name FROM lighthouse WHERE county = '`` anything may follow until the closing quote.
"""

from __future__ import annotations

import bisect
import re
import sqlite3
from collections.abc import Iterator

from .constraint import CharConstraint, State

# The words of SQLite's queries and data changes (sqlite.org/lang_keywords.html, without those
# that only define or administer a schema: a query that writes `create` or `constraint` has lost
# a name) and its core, aggregate, date and math functions. Type names need no entry: they follow
# AS (CAST(x AS INTEGER)), where any word may.
SQL_WORDS = frozenset("""
all and as asc between by case cast collate cross current current_date current_time
current_timestamp default delete desc distinct do else end escape except exclude exists filter first
following for from full glob group groups having in inner insert intersect into is isnull join last
left like limit match natural no not nothing notnull null nulls of offset on or order others outer
over partition preceding range recursive regexp replace returning right row rows select set then
ties to unbounded union update using values when where window with true false
count sum avg min max total group_concat string_agg abs round length lower upper substr substring
trim ltrim rtrim instr coalesce ifnull nullif iif typeof printf format hex quote char unicode
random likelihood likely unlikely sign ceil ceiling floor sqrt power pow exp ln log log10 log2 mod
pi date time datetime julianday strftime unixepoch
row_number rank dense_rank percent_rank cume_dist ntile lag lead first_value last_value nth_value
nocase binary rowid oid _rowid_
""".split())

_BARE = re.compile(r"[^\W\d]\w*")  # a name that may be written without quotes (order_id, Ärzte)
_ALIAS_LIKE = re.compile(r"[A-Za-z][0-9]*")  # T1, t: may be used before the AS that defines it
_SHORT_ALIAS = re.compile(r"[A-Za-z]{1,3}[0-9]*")  # an alias without AS (FROM flight f)
_NAME = r'(?:"[^"]*"|`[^`]*`|\[[^\]]*\]|[^\s(]+)'  # a table name, maybe quoted or schema.table
# a CREATE TABLE statement with its column list (not "CREATE TABLE t AS SELECT ...", which names
# no columns of its own and would run a query), or a comment, which may hide one
_CREATE_OR_COMMENT = re.compile(
    rf"--[^\n]*|/\*.*?(?:\*/|\Z)|\bcreate\s+(?:temp(?:orary)?\s+)?table\s+(?:if\s+not\s+exists\s+)?"
    rf"{_NAME}\s*\(", re.IGNORECASE | re.DOTALL)
_CLOSE = {"'": "'", '"': '"', "`": "`", "[": "]"}
_PUNCT = frozenset("(),.;*=<>!+-/%|&~^?:@$#")  # what SQL writes between words, besides spaces
_SQLITE_STEPS = 10_000  # SQLite VM steps one CREATE TABLE may take (one of 50 columns takes ~600)


def _closing(text: str, i: int) -> int | None:
    """The end of the parenthesised list that opens at ``text[i]``, reading SQL's literals, quoted
    names and comments as SQLite does (a parenthesis inside them does not count); None if none."""
    depth, n = 0, len(text)
    while i < n:
        ch, two = text[i], text[i:i + 2]
        if two in ("--", "/*"):
            end = text.find("\n" if two == "--" else "*/", i + 2)
            i = n if end < 0 else end + (1 if two == "--" else 2)
            continue
        if ch in _CLOSE:
            end = text.find(_CLOSE[ch], i + 1)
            i = n if end < 0 else end + 1
            continue
        depth += {"(": 1, ")": -1}.get(ch, 0)
        i += 1
        if depth == 0:
            return i
    return None


def _statements(text: str) -> Iterator[str]:
    """The ``CREATE TABLE`` statements of ``text`` with their column lists, outside comments
    (prose around them, an apostrophe in it too, is not SQL and is not read as such)."""
    pos = 0
    while (m := _CREATE_OR_COMMENT.search(text, pos)) is not None:
        pos = m.end()
        if m.group().startswith(("--", "/*")):
            continue
        end = _closing(text, m.end() - 1)
        if end is None:
            raise ValueError("a CREATE TABLE statement of the prompt has no closing parenthesis")
        yield text[m.start():end]
        pos = end


def schema(text: str) -> dict[str, list[str]]:
    """Each table of the ``CREATE TABLE`` statements in ``text`` (:func:`_statements`) with its
    columns, as SQLite reads them. A table made twice (a few-shot prompt's examples, each with its
    context) has the columns of both: every name the prompt defines may be written."""
    tables: dict[str, list[str]] = {}
    for i, statement in enumerate(_statements(text), 1):
        for table, columns in _created(statement, i).items():
            same = next((t for t in tables if t.lower() == table.lower()), table)  # (SQLite ignores case)
            tables[same] = list(dict.fromkeys([*tables.get(same, []), *columns]))
    if not tables:
        raise ValueError("the prompt has no CREATE TABLE statement to take names from")
    return tables


def _created(statement: str, i: int) -> dict[str, list[str]]:
    """The table statement ``i`` makes, with its columns, as SQLite reads it (under a bound on
    SQLite's steps)."""
    con = sqlite3.connect(":memory:")
    try:
        steps = iter(range(_SQLITE_STEPS // 100))  # the handler runs every 100 steps; True stops
        con.set_progress_handler(lambda: next(steps, None) is None, 100)
        try:
            con.execute(statement)
        except sqlite3.Error as e:
            raise ValueError(f"CREATE TABLE statement {i} of the prompt is not valid SQL ({e})") from None
        con.set_progress_handler(None, 0)
        tables = [r[0] for r in con.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\' "
            "UNION ALL SELECT name FROM sqlite_temp_master WHERE type = 'table'")]
        return {t: [c[1] for c in con.execute("SELECT * FROM pragma_table_info(?)", (t,))] for t in tables}
    finally:
        con.close()


class SQLNames(CharConstraint):
    """The constraint for a schema (:func:`schema`: table -> columns) and a tokenizer.

    State ``(quote, word, after, aliases)``: the open quote ("" outside), the word being written
    (as written), what the last finished word allows next (``after``: "from" after FROM or JOIN,
    "table:T" after a table T there, "as:T" after AS that follows table T, "as:" after another AS,
    ".Q" after the qualifier Q and a dot, "" otherwise) and the aliases so far, (alias, table or "")
    pairs."""

    def __init__(self, tables: dict[str, list[str]], tokenizer):
        super().__init__(tokenizer)
        self.columns = {self.literal(t): sorted(map(self.literal, set(cols))) for t, cols in tables.items()}
        if not self.columns:
            raise ValueError("no table names to constrain SQL to")
        self.all_columns = sorted({c for cols in self.columns.values() for c in cols})
        self.names = set(self.columns) | set(self.all_columns)
        self.keywords = SQL_WORDS | {w.upper() for w in SQL_WORDS}
        self.words = sorted(self.names | self.keywords)
        # outside quotes only names that need none can be begun ("Order Items" cannot)
        self.bare_words = [w for w in self.words if _bare(w)]
        self.bare_columns = {t: [c for c in cols if _bare(c)] for t, cols in self.columns.items()}
        self.bare_all_columns = [c for c in self.all_columns if _bare(c)]
        self.start = ("", "", "", frozenset())

    @classmethod
    def from_prompt(cls, prompt: str, tokenizer) -> SQLNames:
        """The names of the prompt's ``CREATE TABLE`` statements."""
        return cls(schema(prompt), tokenizer)

    # -- words ---------------------------------------------------------------------------------
    def _members(self, qualifier: str, aliases: frozenset, quoted: bool = True) -> list[str]:
        """The columns that may follow ``qualifier.``: its table's, or every column while the
        qualifier is an alias not defined yet (``SELECT T1.x FROM t AS T1``); unquoted, those
        that need no quotes. An alias bound twice (the same ``T1`` in a subquery) allows the columns
        of either table: which one it means depends on the scope, which this does not follow."""
        tables = sorted({t for a, t in aliases if a == qualifier}) or [qualifier]
        every, named = (self.all_columns, self.columns) if quoted else (self.bare_all_columns,
                                                                         self.bare_columns)
        if len(tables) == 1:
            return named.get(tables[0], every)
        return sorted({c for t in tables for c in named.get(t, every)})

    def _partial_ok(self, word: str, after: str, aliases: frozenset, quoted: bool) -> bool:
        if after.startswith("."):
            return _has_prefix(self._members(after[1:], aliases, quoted), word)
        return (word[0].isdigit() or after.startswith("as:") or _ALIAS_LIKE.fullmatch(word) is not None
                or (after.startswith("table:") and _SHORT_ALIAS.fullmatch(word) is not None)
                or _has_prefix(self.words if quoted else self.bare_words, word)
                or any(a.startswith(word) and (quoted or _bare(a)) for a, _ in aliases))

    def _finish(self, word: str, after: str, aliases: frozenset) -> tuple[str, frozenset] | None:
        """(what the finished ``word`` allows next, aliases) or None if it is not allowed."""
        if word[0].isdigit():
            return "", aliases
        if after.startswith("."):
            return ("", aliases) if word in self._members(after[1:], aliases) else None
        keyword_or_name = word in self.keywords or word in self.names
        if not keyword_or_name and (after.startswith("as:") or (
                after.startswith("table:") and _SHORT_ALIAS.fullmatch(word))):
            return "", aliases | {(word, after.split(":", 1)[1])}
        if not (keyword_or_name or _ALIAS_LIKE.fullmatch(word) or any(a == word for a, _ in aliases)):
            return None
        if word.lower() == "as":
            return "as:" + (after[6:] if after.startswith("table:") else ""), aliases
        if word.lower() in ("with", "recursive"):
            return "as:", aliases  # a common table expression's name (WITH top_paid AS ...)
        if word.lower() in ("from", "join"):
            return "from", aliases
        if word.lower() == "into":  # INSERT INTO t(a, b): a table name, then its columns
            return "into", aliases
        table = after == "from" and (word in self.columns or (word, "") in aliases)
        return ("table:" + word if table else ""), aliases

    # -- characters ------------------------------------------------------------------------------
    def _char(self, state: State, ch: str) -> State | None:
        quote, word, after, aliases = state
        if quote == "'":
            return ("", "", "", aliases) if ch == "'" else state
        if quote:  # a quoted name
            if ch == _CLOSE[quote]:
                done = self._finish(word, after, aliases) if word else None
                return None if done is None else ("", "", *done)
            word += ch
            return (quote, word, after, aliases) if self._partial_ok(word, after, aliases, True) else None
        if ch.isalnum() or ch == "_":
            word += ch
            return ("", word, after, aliases) if self._partial_ok(word, after, aliases, False) else None
        if word:
            if ch == "(" and not (word in self.keywords or after.startswith("as:")
                                  or after == "into" and word in self.columns):
                return None  # a call of what is not SQL's function (AVG(s(*)), name(x)): not written
            done = self._finish(word, after, aliases)
            if done is None:
                return None
            after, aliases = done
            if ch == "." and not word[0].isdigit():
                return ("", "", "." + word, aliases)
        if ch in _CLOSE:
            return (ch, "", after, aliases)
        if ch.isspace():
            return ("", "", after, aliases)
        return ("", "", "", aliases) if ch in _PUNCT else None

    def may_end(self, state: State) -> bool:
        """Outside quotes, after a finished word that is allowed (or no word, unless a qualifier's
        dot waits for its column)."""
        quote, word, after, aliases = state
        return not quote and (self._finish(word, after, aliases) is not None if word
                              else not after.startswith("."))


def _bare(name: str) -> bool:
    """Whether a name may be written without quotes."""
    return _BARE.fullmatch(name) is not None


def _has_prefix(words: list[str], prefix: str) -> bool:
    """Whether a word of the sorted ``words`` starts with ``prefix``."""
    i = bisect.bisect_left(words, prefix)
    return i < len(words) and words[i].startswith(prefix)
