"""Stdlib functions with their parameters renamed: more code data from the same functions.

The code the base model learns from is the CPython standard library, which is finite (8.6M tokens);
a model that sees the same function bodies again learns them by heart (its held-out code loss
rises, docs/default-model.md). :func:`renamed` gives a code-task document (``# module:
qualname``, decorators, signature, docstring, body) back with its parameters renamed (all but
``self``, ``cls`` and the keyword-only ones, which callers name): in the signature, at every use in
the body, and as whole words in the docstring. Attributes, keyword arguments of calls, comments
and other strings are left as written, so the function, called positionally, does what it did;
only the names change, which the model has to copy from the signature instead of recalling. New
names are identifier words of the train-split stdlib (``data/sql_words.py``), one or two joined by
``_``, with the old name's leading underscore.

Example (``rng = random.Random(0)``)::

    # m: f                              # m: f
    def f(self, key, n=2):        ->    def f(self, registry_bdist, tail=2):
        '''Give n keys.'''               '''Give tail keys.'''
        return [key] * n                    return [registry_bdist] * tail

A parameter that a ``global`` or ``nonlocal`` statement names, or that a nested function or lambda
also takes, keeps its name; a function that calls ``locals()`` or ``vars()`` keeps all of them.
Every result is checked: it parses to the original's tree with the names mapped. A function where
that fails (positions inside 3.11's f-strings), that does not parse, or that has no parameter to
rename comes back unchanged.
"""

from __future__ import annotations

import ast
import builtins
import copy
import keyword
import random
import re
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "data"))
import sql_words  # noqa: E402  (identifier words of the train-split stdlib modules)

_RENAMABLE = re.compile(r"_?[a-z][a-z0-9_]*")
_RESERVED = set(keyword.kwlist) | set(keyword.softkwlist) | set(dir(builtins)) | {"self", "cls"}


def renamed(text: str, rng: random.Random) -> str:
    """``text`` (one function, as the code task poses it) with its parameters renamed; unchanged
    where that cannot be done safely (module docstring)."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return text
    fn = tree.body[0] if len(tree.body) == 1 else None
    if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return text
    a = fn.args
    # keyword-only parameters keep their names: every caller writes them
    params = [x.arg for x in (*a.posonlyargs, *a.args, a.vararg, a.kwarg) if x is not None]
    if any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in ("locals", "vars")
           for n in ast.walk(tree)):
        return text  # names read as strings
    declared = {name for n in ast.walk(tree) if isinstance(n, (ast.Global, ast.Nonlocal)) for name in n.names}
    own = {id(x) for x in (*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg) if x is not None}
    # a nested def's or lambda's parameter of the same name: callers may name it (inner(key=...))
    nested = {n.arg for n in ast.walk(tree) if isinstance(n, ast.arg) and id(n) not in own}
    params = [p for p in params if _RENAMABLE.fullmatch(p) and p not in _RESERVED | declared | nested]
    if not params:
        return text
    taken = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} | {
        n.arg for n in ast.walk(tree) if isinstance(n, ast.arg)} | _RESERVED
    names = {}
    for p in params:
        new = _new_name(rng, p, taken)
        names[p] = new
        taken.add(new)
    out = _apply(text, tree, fn, names)
    try:
        same = ast.dump(ast.parse(out)) == ast.dump(_mapped(tree, names))
    except SyntaxError:
        same = False
    return out if same else text


def _new_name(rng: random.Random, old: str, taken: set[str]) -> str:
    while True:
        words = [rng.choice(sql_words.WORDS) for _ in range(1 if rng.random() < 0.7 else 2)]
        new = "_" * (len(old) - len(old.lstrip("_"))) + "_".join(words)
        if new not in taken:
            return new


def _docstring(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> ast.Constant | None:
    first = fn.body[0]
    value = first.value if isinstance(first, ast.Expr) else None
    return value if isinstance(value, ast.Constant) and isinstance(value.value, str) else None


def _words(names: dict[str, str]) -> tuple[re.Pattern, Callable]:
    """The docstring's rule: a name as a whole word, not the letter of an escape (``\\n``)."""
    alternatives = "|".join(map(re.escape, sorted(names, key=len, reverse=True)))
    pattern = re.compile(rf"(?<!\\)\b({alternatives})\b")
    return pattern, lambda m: names[m.group(1)]


def _apply(text: str, tree: ast.Module, fn, names: dict[str, str]) -> str:
    """The text with each renamed name replaced where the tree says it stands (offsets are UTF-8
    bytes within a line), and the docstring's lines with the names replaced as whole words."""
    lines = [line.encode() for line in text.splitlines(keepends=True)]
    spots = []  # (line index, byte offset, old name)
    for n in ast.walk(tree):
        if isinstance(n, ast.Name) and n.id in names:
            spots.append((n.lineno - 1, n.col_offset, n.id))
        elif isinstance(n, ast.arg) and n.arg in names:
            spots.append((n.lineno - 1, n.col_offset, n.arg))
    for i, col, old in sorted(spots, reverse=True):  # right to left: earlier offsets stay valid
        line = lines[i]
        if line[col:col + len(old)] != old.encode():
            return text  # a position that is not the name: leave the function as it is
        lines[i] = line[:col] + names[old].encode() + line[col + len(old):]
    doc = _docstring(fn)
    if doc is not None:
        pattern, sub = _words(names)
        for i in range(doc.lineno - 1, doc.end_lineno):
            lines[i] = pattern.sub(sub, lines[i].decode()).encode()
    return b"".join(lines).decode()


def _mapped(tree: ast.Module, names: dict[str, str]) -> ast.Module:
    """The tree that the renamed text must parse to: the names mapped, the docstring's words too."""
    tree = copy.deepcopy(tree)
    for n in ast.walk(tree):
        if isinstance(n, ast.Name) and n.id in names:
            n.id = names[n.id]
        elif isinstance(n, ast.arg) and n.arg in names:
            n.arg = names[n.arg]
    doc = _docstring(tree.body[0])
    if doc is not None:
        pattern, sub = _words(names)
        doc.value = pattern.sub(sub, doc.value)
    return tree
