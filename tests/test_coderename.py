"""scripts/coderename.py: a function with its parameters renamed does what it did (run, against
the original), and its text differs from the original only in those names."""

from __future__ import annotations

import io
import json
import random
import sys
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import coderename  # noqa: E402

FUNCTIONS = {  # what a renamer gets wrong: attributes, keyword arguments, strings, scopes, escapes
    "kinds": ('# m: kinds\ndef kinds(key, n=2, *rest, sep="-", **extra):\n'
              '    """Join key n times with sep; rest and extra are counted.\\n\\n    n >= 0."""\n'
              '    parts = [key] * n  # key, n times\n'
              '    return sep.join(parts) + f"{len(rest)}:{sorted(extra)!r}:{n}" + "key n"\n'),
    "scopes": ('# m: scopes\ndef scopes(items, key=None, limit=3):\n'  # items, key: nested ones take them
               '    def inner(key=key):\n        return [k for k in items if k != key][:limit]\n'
               '    pick = lambda items: items[:1]\n'
               '    return inner(key=key) + pick(items), dict(key=1, items=2)["key"]\n'),
    "attrs": ('# m: attrs\ndef attrs(self, value):\n'
              '    self.value = value\n    return (self.value, type(self).__name__, value.real)\n'),
    "scopes_of_comprehensions": ('# m: c\ndef c(data, level=1):\n    return {level: [d * level for d in data'
                                 ' if d > level] for level in data}\n'),
}
CALLS = {"kinds": [(("a",), {}), (("a", 3, 1, 2), {}), (("b", 0), {}),
                   (("c", 1), {"sep": "+", "z": 1, "y": 2})],
         "scopes": [(([1, 2, 3],), {}), (([1, 2, 3], 2), {}), (([1, 2, 3], 2, 1), {})],
         "attrs": [((type("S", (), {})(), 3), {})],
         "scopes_of_comprehensions": [(([1, 2, 3],), {}), (([4, 5], 4), {})]}


def _run(text: str, name: str, args: tuple, kwargs: dict):
    space: dict = {}
    exec(compile(text, name, "exec"), space)  # noqa: S102 (the test's own functions)
    fn = next(v for k, v in space.items() if callable(v) and k != "__builtins__")
    return fn(*args, **kwargs)


def _tokens(text: str) -> list[tuple[int, str]]:
    return [(t.type, t.string) for t in tokenize.generate_tokens(io.StringIO(text).readline)]


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_a_renamed_function_does_what_it_did(name):
    text = FUNCTIONS[name]
    for seed in range(5):
        new = coderename.renamed(text, random.Random(seed))
        assert new != text
        for args, kwargs in CALLS[name]:
            assert _run(new, name, args, kwargs) == _run(text, name, args, kwargs)
    new = coderename.renamed(FUNCTIONS["kinds"], random.Random(0))
    assert ', sep="-"' in new and '"key n"' in new and "# key, n times" in new  # keyword-only, strings
    assert "\\n\\n" in new  # the docstring's escapes are not words
    new = coderename.renamed(FUNCTIONS["scopes"], random.Random(0))
    assert "def scopes(items, key=None, " in new and "inner(key=key)" in new and "limit" not in new
    locals_read = "# m: f\ndef f(a, b):\n    return vars()\n"  # names read as strings: all kept
    assert coderename.renamed(locals_read, random.Random(0)) == locals_read


def test_only_parameter_names_change_on_the_stdlib_functions():
    """Oracle: Python's tokenizer. Token by token, the renamed text equals the original but for
    NAME tokens, and each original name maps to one new name everywhere it changed."""
    rows = [json.loads(line) for line in open(ROOT / "data" / "code" / "valid.jsonl")]  # shipped
    rng, changed = random.Random(0), 0
    for r in rows:
        text = r["prompt"] + r["completion"]
        new = coderename.renamed(text, rng)
        if new == text:
            continue
        changed += 1
        a, b = _tokens(text), _tokens(new)
        assert len(a) == len(b)
        mapping: dict[str, str] = {}
        for (ta, sa), (tb, sb) in zip(a, b):
            assert ta == tb
            if ta == tokenize.NAME and sa != sb:
                assert mapping.setdefault(sa, sb) == sb
            elif ta not in (tokenize.NAME, tokenize.STRING):
                assert sa == sb
        assert mapping and "self" not in mapping and "cls" not in mapping
        assert len(set(mapping.values())) == len(mapping)
    assert changed > 250


def test_what_cannot_be_renamed_comes_back_unchanged():
    rng = random.Random(0)
    for text in ("# m: f\ndef f(self):\n    return self.x\n",  # no parameter but self
                 "# m: f\ndef f(x):\n    global x\n    return x\n",  # not valid Python
                 "# m: f\ndef f(x):\n    def g():\n        nonlocal x\n        x = 1\n    return x\n",
                 "x = 1\n", "def f(:\n"):
        assert coderename.renamed(text, rng) == text
