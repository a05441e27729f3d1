"""``sql_names``: generated SQL names only the schema's tables and columns. SQLite is the oracle:
a query it runs on the prompt's tables is allowed to the end; one it refuses because a table or
column does not exist is stopped."""

import json
import random
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from mlx_specstream.api import DEFAULT_MODEL
from mlx_specstream.constraint import DONE, TokenConstraint
from mlx_specstream.sql_names import SQLNames, schema
from mlx_specstream.tokenizer import load_tokenizer

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
from sqlgen import context  # noqa: E402  (a prompt's CREATE TABLE statements, for SQLite)

PROMPT = ("### Context:\nCREATE TABLE lighthouse (name VARCHAR, county VARCHAR, height_m INTEGER, "
          "lit_year INTEGER);\n### Question:\nWhich lighthouses in Cornwall are taller than 30 metres?\n"
          "### SQL:\n")


@pytest.fixture(scope="module")
def tok():
    if not (DEFAULT_MODEL / "tokenizer.json").exists():
        pytest.skip("the default model is not built")
    return load_tokenizer(DEFAULT_MODEL)


def allowed(constraint: SQLNames, tok, sql: str) -> bool:
    """Whether the constraint lets ``sql`` be generated to the end (EOS included)."""
    state = constraint.walk(constraint.start, tok.encode(sql, add_special_tokens=False))
    return state is not None and constraint.advance(state, tok.eos_token_id) == DONE


def sqlite_verdict(ctx: str, sql: str) -> str:
    """"runs", "missing" (a table or column that does not exist) or "other" (any other error)."""
    con = sqlite3.connect(":memory:")
    try:
        con.executescript(ctx)
        con.execute(sql).fetchall()
        return "runs"
    except sqlite3.Error as e:
        return "missing" if re.match(r"no such (column|table)", str(e)) else "other"
    finally:
        con.close()


def test_schema_names_as_sqlite_reads_them():
    text = ('x\nCREATE TABLE "order item" (id INTEGER, [unit price] REAL, qty INT);\n'
            "create table  Shop(shop_id INTEGER PRIMARY KEY, name TEXT, CHECK (shop_id > 0));")
    assert schema(text) == {"order item": ["id", "unit price", "qty"], "Shop": ["shop_id", "name"]}
    with pytest.raises(ValueError, match="no CREATE TABLE"):
        schema("SELECT 1")
    with pytest.raises(ValueError, match="statement 1 .* not valid SQL"):
        schema("CREATE TABLE t (a INTEGER,)")
    with pytest.raises(ValueError, match="no closing parenthesis"):
        schema("CREATE TABLE t (a INTEGER")
    # statements, not prose or comments; parentheses in literals and comments are not the list's
    assert schema("Here's the schema; don't guess.\nCREATE TABLE \"Bob's orders\" (id INT);") == {
        "Bob's orders": ["id"]}  # an apostrophe in prose is not a literal's
    columns = ", ".join(f"c{j} INTEGER" for j in range(8))
    big = "\n".join(f"CREATE TABLE t{i} ({columns});" for i in range(400))
    assert len(schema(big)) == 400  # the bound on SQLite's steps is per statement
    # a few-shot prompt makes a table once per example: every column either makes may be written
    shots = ("### Context:\nCREATE TABLE t (a INTEGER);\n### SQL:\nSELECT a FROM t\n\n"
             "### Context:\nCREATE TABLE T (a INTEGER, b TEXT);\n### SQL:\n")
    assert schema(shots) == {"t": ["a", "b"]}
    assert schema("Given the CREATE TABLE statements below, write SQL.\n-- CREATE TABLE old (zz INT)\n"
                  "CREATE TABLE t (a INT, b TEXT DEFAULT ')', c TEXT DEFAULT '(' -- an id (primary\n"
                  ", d INT /* ( */); CREATE TEMP TABLE tmp (x INT)") == {"t": ["a", "b", "c", "d"],
                                                                       "tmp": ["x"]}
    # SQLite's own tables are not the schema's
    autoincrement = "CREATE TABLE p (p_id INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT)"
    assert schema(autoincrement) == {"p": ["p_id", "name"]}
    # a table made by a query is not read (it would run the query: this one never ends)
    with pytest.raises(ValueError, match="no CREATE TABLE"):
        schema("CREATE TABLE t AS SELECT * FROM (WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL "
               "SELECT x + 1 FROM c) SELECT x FROM c)")


def test_every_reference_query_is_allowed(tok):
    """No false stops: every reference query of the held-out sql splits (which SQLite runs) can be
    written to the end."""
    for split in ("valid", "test"):
        for line in (ROOT / "data" / "sql" / f"{split}.jsonl").read_text().splitlines():
            row = json.loads(line)
            c = SQLNames.from_prompt(row["prompt"], tok)
            assert allowed(c, tok, row["completion"]), (row["prompt"], row["completion"])


def test_misspelt_names_are_stopped_as_sqlite_refuses_them(tok):
    """Every schema name of 300 test queries misspelt at random (a letter dropped, doubled or
    changed): where SQLite says the name does not exist the constraint stops the query, where it
    runs (the misspelling is another real name) the constraint lets it through."""
    rng = random.Random(0)
    rows = [json.loads(line) for line in (ROOT / "data" / "sql" / "test.jsonl").read_text().splitlines()]
    verdicts = {"runs": 0, "missing": 0}
    for row in rows[:300]:
        c = SQLNames.from_prompt(row["prompt"], tok)
        words = [m for m in re.finditer(r"[A-Za-z_][A-Za-z0-9_]*", row["completion"])
                 if m.group().lower() in c.names]
        m = rng.choice(words)
        w, i = m.group(), rng.randrange(len(m.group()))
        edit = rng.choice([w[:i] + w[i + 1:], w[:i] + w[i] + w[i:],
                           w[:i] + rng.choice("aeioust") + w[i + 1:]])
        if not edit or edit[0].isdigit():
            continue
        sql = row["completion"][:m.start()] + edit + row["completion"][m.end():]
        verdict = sqlite_verdict(context(row["prompt"]), sql)
        if verdict == "other":
            continue
        verdicts[verdict] += 1
        assert allowed(c, tok, sql) == (verdict == "runs"), (sql, verdict)
    assert verdicts["missing"] > 200


def test_literals_aliases_and_quoted_names(tok):
    """Names as the schema spells them, keywords in lower or upper case, literals free."""
    c = SQLNames.from_prompt(PROMPT, tok)
    assert allowed(c, tok, "SELECT name FROM lighthouse WHERE county = 'Any words; at all (created)' "
                           "AND height_m > 30.5")
    assert allowed(c, tok, 'SELECT L.name, COUNT(*) AS n_lit FROM lighthouse AS L GROUP BY L.name '
                           'ORDER BY n_lit DESC LIMIT 1')
    assert allowed(c, tok, 'select "lit_year" from lighthouse l where l.county is not null')
    assert allowed(c, tok, "SELECT CAST(height_m AS REAL), count (*) FROM lighthouse ORDER BY "
                           "lit_year NULLS LAST")
    assert allowed(c, tok, "INSERT INTO lighthouse(name, county) VALUES ('a', 'b')")  # a name and "("
    assert allowed(c, tok, "WITH tall(n) AS (SELECT name FROM lighthouse) SELECT n FROM tall")
    for bad in ("SELECT created FROM lighthouse", 'SELECT "height" FROM lighthouse',
                "SELECT name FROM lighthouses", "SELECT name FROM lighthouse WHERE county = 'open",
                "SELECT name FROM lighthouse WHERE county = \x07",
                # a call of what is no function of SQL's: an invented name, a column, a table
                "SELECT AVG(s(*)) FROM lighthouse", "SELECT name(height_m) FROM lighthouse",
                "SELECT lighthouse(name) FROM lighthouse"):
        assert not allowed(c, tok, bad), bad


def test_an_alias_bound_twice_allows_either_tables_columns(tok):
    """``T1`` names one table outside a subquery and another inside it: SQLite runs both queries,
    and the constraint allows them whatever order Python's hash seed gives a set (once it picked
    one table by that order, stopping a correct query in some processes)."""
    prompt = ("### Context:\nCREATE TABLE singer (singer_id INT, name TEXT);\n"
              "CREATE TABLE concert (concert_id INT, venue TEXT);\n\n### Question:\nq\n\n### Answer:\n")
    queries = ["SELECT T1.name FROM singer AS T1 WHERE T1.singer_id IN "
               "(SELECT concert_id FROM concert AS T1 WHERE T1.venue = 'x')",
               "SELECT T1.venue FROM concert AS T1 WHERE T1.concert_id IN "
               "(SELECT singer_id FROM singer AS T1 WHERE T1.name = 'y')"]
    code = ("import sys; sys.path[:0] = [{!r}]; from test_sql_names import *; "
            "tok = load_tokenizer(DEFAULT_MODEL); c = SQLNames.from_prompt({!r}, tok); "
            "print([allowed(c, tok, q) for q in {!r}])")
    for seed in ("1", "2", "3"):
        for q in queries:
            assert sqlite_verdict(context(prompt), q) == "runs"
        out = subprocess.run([sys.executable, "-c", code.format(str(Path(__file__).parent), prompt, queries)],
                             capture_output=True, text=True, env={"PYTHONHASHSEED": seed, "PATH": ""})
        assert out.stdout.strip() == "[True, True]", out.stderr[-500:]


def test_every_word_begun_can_be_finished(tok):
    """No dead end: each word the constraint lets a word being written become (keywords in both
    cases, names) can be finished, in the places where words are checked against the lists."""
    c = SQLNames.from_prompt(PROMPT, tok)
    for before in ("SELECT ", "SELECT name FROM lighthouse WHERE ", "SELECT lighthouse."):
        for w in c.words if not before.endswith(".") else c.columns["lighthouse"]:
            state = c.walk(c.start, tok.encode(before + w, add_special_tokens=False))
            assert state is not None, before + w
            ends = [tok.encode(end, add_special_tokens=False)[-1:] for end in "x (x"]
            assert any(c.walk(state, end) is not None for end in ends), before + w


def test_names_that_need_quotes_or_bytes_never_leave_nothing_allowed(tok):
    """A name with a space can be written only quoted (bare, its first word would be a dead end);
    one with characters the tokenizer writes as byte tokens can be written in full; and wherever
    the constraint lets generation go, some token may follow."""
    c = SQLNames.from_prompt('CREATE TABLE "Order Items" ("Item Id" INTEGER, prix REAL); '
                             'CREATE TABLE café (nom TEXT, "prénom" TEXT, rank INTEGER)', tok)
    good = ['SELECT "Item Id", prix FROM "Order Items" WHERE prix > 3',
            "SELECT nom, prénom FROM café AS c WHERE c.prénom = 'Zoé'",
            "WITH top AS (SELECT nom, prix FROM café, \"Order Items\") SELECT nom FROM top",
            "SELECT nom, RANK() OVER (ORDER BY rank) FROM café"]
    for sql in good:
        assert allowed(c, tok, sql), sql
        state = c.start
        for t in tok.encode(sql, add_special_tokens=False):
            assert c.allowed(state).any(), sql
            state = c.advance(state, t)
    for bad in ("SELECT Order", "SELECT nom AS \"my name\" FROM café ORDER BY my"):
        assert c.walk(c.start, tok.encode(bad, add_special_tokens=False)) is None, bad
    # found by a new user: byte tokens once read as any byte wrote `cafÝ` for `café`
    by_byte = {b: tok.token_to_id(f"<0x{b:02X}>") for b in range(256)}  # the byte tokens
    head = c.walk(c.start, tok.encode("SELECT nom FROM caf", add_special_tokens=False))
    for ch, ok in (("é", True), ("Ý", False), ("è", False)):
        state = c.walk(head, [by_byte[b] for b in ch.encode()])
        assert (state is not None and c.may_end(state)) is ok, ch
    assert c.walk(head, [by_byte[0xC3], by_byte[0x20]]) is None  # a character cut short
    doctors = SQLNames.from_prompt("CREATE TABLE Ärzte (name TEXT)", tok)  # found by a review: SQLite
    assert allowed(doctors, tok, "SELECT name FROM Ärzte")  # takes such a name without quotes


def test_trie_mask_equals_token_by_token(tok):
    """The mask read from the tokenizer's text trie (sampling) is the one ``advance`` gives token
    by token, at every state along 5 reference queries."""
    rows = [json.loads(line) for line in (ROOT / "data" / "sql" / "test.jsonl").read_text().splitlines()][:5]
    states = 0
    for row in rows:
        c = SQLNames.from_prompt(row["prompt"], tok)
        state = c.start
        for t in [*tok.encode(row["completion"], add_special_tokens=False), tok.eos_token_id]:
            assert (c.allowed(state) == TokenConstraint.allowed(c, state)).all(), state
            state, states = c.advance(state, t), states + 1
    assert states > 100


def test_schema_names_that_are_sql_words(tok):
    """A column named like a function or a keyword is a column."""
    c = SQLNames.from_prompt("CREATE TABLE log (date DATE, first TEXT, count INTEGER)", tok)
    assert allowed(c, tok, "SELECT date, first FROM log WHERE count > 2 ORDER BY date")
    assert allowed(c, tok, "SELECT COUNT(*), MAX(date) FROM log")


def test_generate_writes_only_schema_names(tok):
    """The shipped model writes `built` for a `year` column here (a name the schema lacks); with
    sql_names it cannot, and a lossless adapter's output stays constrained AR's."""
    from mlx_specstream.api import generate, load

    row = [json.loads(line) for line in (ROOT / "data" / "sql" / "test.jsonl").read_text().splitlines()][27]
    model, _ = load(adapter="sql-lossless", fuse=False)
    free = generate(model, tok, row["prompt"], max_tokens=96, mode="ar")
    assert sqlite_verdict(context(row["prompt"]), free.text) == "missing", free.text
    ar = generate(model, tok, row["prompt"], max_tokens=96, mode="ar", sql_names=True)
    ss = generate(model, tok, row["prompt"], max_tokens=96, sql_names=True)
    assert sqlite_verdict(context(row["prompt"]), ar.text) == "runs", ar.text
    assert ss.tokens == ar.tokens and ss.stats.mean_accepted_tokens > 1.5


def test_cli_sql_names(tok):
    cli = [sys.executable, "-m", "mlx_specstream.cli", "generate", "--mode", "ar", "-n", "40", "--sql-names"]
    res = subprocess.run([*cli, "--prompt", PROMPT], capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    assert sqlite_verdict(context(PROMPT), res.stdout.strip()) == "runs", res.stdout
    res = subprocess.run([*cli, "--prompt", "Which lighthouses are tallest?"], capture_output=True,
                         text=True, timeout=600)
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert res.returncode != 0 and len(lines) == 1 and "no CREATE TABLE" in lines[0], res.stderr
