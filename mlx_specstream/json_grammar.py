"""JSON by a JSON schema, as a token constraint: text that is a JSON value the schema allows, read
character by character by a pushdown machine (docs/design.md#constrained-decoding). OpenAI's
``response_format`` (:class:`JSONValue`, :func:`response_constraint`) and the arguments of forced
tool calls (:mod:`.tool_choice`) are decoded under it.

What a schema says, as far as it reads as a grammar (:meth:`JSONGrammar._read`): ``type``
(string with ``pattern``, ``format`` (:data:`FORMATS`), ``minLength`` and ``maxLength``; number
and integer with ``minimum``, ``maximum`` and their exclusive forms (then written without an
exponent); boolean, null, array with ``items``, ``minItems`` and ``maxItems``, object; a list of
types), ``properties`` (each key once, in any order, only those named:
``additionalProperties`` is read as false there, as llama.cpp's schema grammars read it; none
where ``properties`` is empty, as OpenAI writes a function without arguments, unless
``additionalProperties`` is true) with
``required``; an object of any keys whose values follow ``additionalProperties`` (Pydantic's
``dict[str, X]``), each key once there too, as in any object (a parser would keep only the
last value; ``"a"`` and ``"\\u0061"`` are one key); ``enum`` and ``const`` (an object or array
written as ``json.dumps`` writes it); ``anyOf``
and ``oneOf`` (read as ``anyOf``: a value of several alternatives is not refused), ``allOf`` of
one schema, OpenAPI's ``nullable``, and ``$ref`` to the schema's own parts (``#/$defs/Item``,
``#``; recursive ones too), which is what Pydantic's ``model_json_schema`` writes. Other
keywords (:data:`UNREAD`: ``multipleOf``, ``prefixItems``, ``allOf`` of several, other formats)
leave that value unconstrained by them: any value of its type, or any JSON value; a strict
``response_format`` with one of them is refused. A string with a pattern, a format or bounds is
read with its value (escapes decoded) in its state, searched with ``regex``'s partial matching at
every character, so such a state is read once per string, not once per state of all strings.
Numbers have at most 16 digits before the point, after it and in the exponent; wherever JSON allows
whitespace there may be a space or a tab, or a line break (LF or CRLF) and up to 20 spaces or tabs
(llama.cpp's bounds: a model cannot write digits or blank lines forever), and up to two whitespace
characters before the text's value and after it. A string may not hold a ``marker`` (a forced
call's ``</tool_call>``: the reply's reader would end the call there). The end of the text (EOS)
may come only after the whole value. The decode loop applies a constraint to the target only
(:mod:`.constraint`), so speculative decoding stays exact for the constrained model.

States are nested tuples ``(kind, ..., then)``: what the next character may be, and the state to
go on in once that part is written; inside a string or between values they repeat, so a mask
for sampling is read once per state. Where a value may still be of several alternatives (two
objects of an ``anyOf`` after ``{``), the state is ``("alt", states)``, each read on.

Example (schema ``{"type": "object", "properties": {"city": {"type": "string"}, "days":
{"type": "integer"}}, "required": ["city"]}``): after ``{`` only ``"city"`` or ``"days"`` may
begin, ``}`` only once ``"city"`` has been written; after ``{"city": "Pa`` anything but a control
character; after ``"days": 1`` a digit, ``,`` or ``}``; EOS only after the closing ``}``.
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import json
import math
import re
import urllib.parse
from fractions import Fraction

from .constraint import CharConstraint, Partial, State, check_reads_tokens

WS = frozenset(" \t\n\r")  # JSON's whitespace
INDENT = 20  # between two parts of a value: nothing, a space or tab, or a line break and 20 spaces or tabs
SPACE_AROUND = 2  # whitespace characters allowed before the text's first value and after its last
# numbers of at most 16 digits before the point, after it and in the exponent (llama.cpp's bounds:
# a model cannot write digits forever)
_NUMBER = re.compile(r"-?(?:0|[1-9]\d{0,15})(?:\.\d{1,16})?(?:[eE][+-]?\d{1,16})?")
_INTEGER = re.compile(r"-?(?:0|[1-9]\d{0,15})")
_LITERALS = {"t": "rue", "f": "alse", "n": "ull"}
_PLAIN = re.compile(r'[^"\\\x00-\x1f]+')  # a property name JSON writes as it is

JSON_TYPES = ("string", "number", "integer", "boolean", "null", "array", "object")
# keywords that a schema may hold and this grammar does not enforce (a strict response_format refuses them)
UNREAD = frozenset("""multipleOf dependencies patternProperties
propertyNames minProperties maxProperties prefixItems uniqueItems contains not if dependentRequired
dependentSchemas unevaluatedProperties unevaluatedItems""".split())

class SchemaError(ValueError):
    """A schema that is not a valid one (a keyword of the wrong kind, bounds no value meets, a
    ``$ref`` to nothing), as opposed to a valid one this grammar cannot read (a ValueError: bounds
    beyond 16 digits, a pattern Python's ``regex`` does not take)."""


# schema nodes (JSONGrammar.nodes holds them; states name them by index)
ANY, FREE_OBJECT, EMPTY_OBJECT = ("any",), ("object", (), frozenset()), ("choice", ("{}",))
_SCALARS = {"string": ("string",), "number": ("number",), "integer": ("integer",),
            "boolean": ("boolean",), "null": ("null",)}


@dataclasses.dataclass
class _Reading:
    """One schema being read: its ``root`` (what ``$ref`` points into), the node of each ``$ref``
    and of each distinct schema read so far (the same part is read once however often it comes)."""

    root: object
    refs: dict[str, int] = dataclasses.field(default_factory=dict)
    read: dict[str, int] = dataclasses.field(default_factory=dict)


class JSONGrammar(CharConstraint):
    """The machine over JSON values by schema nodes; a subclass says what surrounds them
    (``start``, :meth:`_frame` for its own states, :meth:`may_end`). ``markers``: texts no string
    may hold; those that are one control token are read as their text."""

    def __init__(self, tokenizer, markers=()):
        super().__init__(tokenizer)
        self.nodes: list[tuple] = []
        self._ids: dict[tuple, int] = {}
        self.marker_texts = [self.literal(m) for m in markers]
        for marker in self.marker_texts:
            self.read_as_text(marker)
        self.skips_ws = SKIPS_WS  # the states JSON's whitespace may come in (it leaves them as they are)
        self.unread: set[str] = set()  # the schemas' keywords that do not constrain (UNREAD)

    # -- schemas -----------------------------------------------------------------------------
    def _node(self, schema, top: bool = False) -> int:
        """The index of a schema's node (``$ref`` read against ``schema`` as the root). ``top``: an
        object whatever the schema says (a call's arguments, OpenAI's ``json_object``)."""
        n = self._read(schema, _Reading(schema))
        if top and any(self.nodes[m][0] not in ("object", "map") and self.nodes[m] != EMPTY_OBJECT
                       for m in self._entries(n)):
            n = self._add(FREE_OBJECT)
        return n

    def _read(self, schema, ctx: _Reading) -> int:
        """A schema's node, read once per distinct schema (``ctx.read``): :meth:`_parse`."""
        key = json.dumps(schema, sort_keys=True, default=repr)
        if key not in ctx.read:
            ctx.read[key] = self._parse(schema, ctx)
        return ctx.read[key]

    def _parse(self, schema, ctx: _Reading) -> int:
        """A schema's node: ``("string",)`` and the other scalars, ``("text", patterns, min, max)``
        (a string by pattern, format or length), ``("bounded", integer, low, low excluded, high,
        high excluded)``, ``("choice", texts)`` for ``enum``/``const`` (the values as JSON writes
        them, sorted), ``("array", item, min, max)``, ``("object", ((name, node), ...),
        required)`` (no names: any object), ``("map", node)`` (any names, each value by the node),
        ``("union", nodes)`` (``anyOf``, ``oneOf``, a list of types, ``nullable``), ``("ref",
        node)`` (``ctx.refs``: one per ``$ref``, so that a schema may refer to itself), ``ANY``.
        What is read without being enforced goes to :attr:`unread`."""
        if not isinstance(schema, dict):
            return self._add(ANY)
        kinds = schema.get("type")
        for kind in kinds if isinstance(kinds, list) else [kinds] if kinds is not None else []:
            if kind not in JSON_TYPES:
                raise SchemaError(f"a JSON schema's type must be one of {', '.join(JSON_TYPES)}, "
                                  f"not {kind!r}")
        _check_values(schema)
        self._unread(schema)
        rest = {k: v for k, v in schema.items() if k not in ("anyOf", "oneOf", "allOf", "nullable")}
        alts = schema.get("anyOf", schema.get("oneOf"))
        if isinstance(schema.get("$ref"), str):  # its siblings other than nullable are not read
            alts = [{"$ref": schema["$ref"]}] if schema.get("nullable") is True else None
            if alts is None:
                return self._ref(schema["$ref"], ctx)
        one = schema.get("allOf")
        if isinstance(one, list) and len(one) == 1 and isinstance(one[0], dict):  # as pydantic wraps a $ref
            return self._read(_merged({k: v for k, v in schema.items() if k != "allOf"}, one[0]), ctx)
        if isinstance(alts, list) and alts and all(isinstance(a, dict) for a in alts):
            if any("$ref" in a for a in alts):  # a reference is read alone: what is beside it is not
                self.unread.update(f"{k} beside $ref" for k in rest if k in _CONSTRAINING)
            alts = [a if "$ref" in a else _merged(rest, a) for a in alts]
        elif isinstance(kinds, list) and kinds:
            alts = [{**rest, "type": k} for k in kinds]
        else:
            alts = None
        if schema.get("nullable") is True:  # OpenAPI's way to say "or null"
            alts = [*(alts or [rest]), {"type": "null"}]
        if alts:  # an alternative none of its enum meets is none: {"type": ["string", "null"], "enum": [...]}
            alts = [a for a in alts if not _never(a)] or _refuse_enum(schema)
        elif _never(schema):
            _refuse_enum(schema)
        if alts:
            members = {self._read(a, ctx) for a in alts}
            choices = {m for m in members if self.nodes[m][0] == "choice"}
            if len(choices) > 1:  # enums and consts in one choice (an alt state would hold each)
                texts = sorted({t for m in choices for t in self.nodes[m][1]})
                members = members - choices | {self._add(("choice", tuple(texts)))}
            if len(members) > MAX_ALTS:
                self.unread.add(f"anyOf of more than {MAX_ALTS} alternatives")
            members = sorted(members)
            return members[0] if len(members) == 1 else self._add(("union", tuple(members)))
        if "allOf" in schema:  # more than one schema to meet at once: not read
            return self._add(ANY)
        values = _enum(schema)
        kind = kinds if isinstance(kinds, str) else "object" if "properties" in schema else None
        if values:
            return self._add(("choice", tuple(map(self.literal, values))))
        if kind == "string" and any(k in schema for k in _STRING_WORDS):
            node = _text_node(schema)
            for pattern in node[1]:
                self.literal(pattern.pattern)  # its characters' first bytes may be written as bytes
            return self._add(node)
        if kind in ("number", "integer") and any(k in schema for k in _BOUNDS):
            node = ("bounded", kind == "integer", *_bounds(schema))
            if not (_reaches(node, "") or _reaches(node, "-")):  # no number, positive or negative
                bounds = ", ".join(f"{k} {schema[k]}" for k in _BOUNDS if k in schema)
                low, low_out, high, high_out = node[2:]
                crossed = low is not None and high is not None and (
                    low > high or low == high and (low_out or high_out))
                if crossed:  # no number at all: as min above max, not a grammar's bound
                    raise SchemaError(f"a JSON schema allows no {kind} within {bounds}")
                raise ValueError(f"a JSON schema allows no {kind} of at most 16 digits within {bounds}")
            return self._add(node)
        if kind in _SCALARS:
            return self._add(_SCALARS[kind])
        if kind == "array":
            return self._add(("array", self._read(schema.get("items"), ctx), schema.get("minItems", 0),
                              schema.get("maxItems")))
        if kind != "object":
            return self._add(ANY)
        props = schema.get("properties")
        if isinstance(props, dict):  # a property whose schema is false may not be written
            props = {k: v for k, v in props.items() if v is not False}
        extra = schema.get("additionalProperties")
        if isinstance(props, dict) and props and all(_PLAIN.fullmatch(k) for k in props):
            listed = schema.get("required")
            listed = listed if isinstance(listed, list) else []
            required = frozenset(r for r in listed if isinstance(r, str) and r in props)
            return self._add(("object", tuple(sorted((self.literal(k), self._read(props[k], ctx))
                                                    for k in props)), required))
        if not props and isinstance(extra, dict) and extra:
            return self._add(("map", self._read(extra, ctx)))
        if props == {} and extra not in (True, {}) or not props and extra is False:  # no property written
            return self._add(EMPTY_OBJECT)
        return self._add(FREE_OBJECT)

    def _unread(self, schema: dict) -> None:
        """Note in :attr:`unread` what of ``schema`` the grammar will not enforce."""
        kinds = schema.get("type")
        kinds = set(kinds) if isinstance(kinds, list) else {kinds} if isinstance(kinds, str) else None
        said = self.unread
        said.update(k for k in schema if k in UNREAD)
        if isinstance(schema.get("allOf"), list) and len(schema["allOf"]) > 1:
            said.add("allOf")
        if "anyOf" in schema and "oneOf" in schema:
            said.add("oneOf beside anyOf")
        if isinstance(schema.get("$ref"), str):
            if not schema["$ref"].startswith("#"):
                said.add(f"$ref {schema['$ref']!r}")
            said.update(f"{k} beside $ref" for k in schema if k in _CONSTRAINING)
        if isinstance(schema.get("items"), list):
            said.add("items as a list")
        if _enum(schema) == ():
            said.add("enum or const of values JSON cannot write (NaN, infinities)")
        if "enum" in schema or "const" in schema:  # its values are checked against the rest (_meets)
            said.update(f"{k} beside enum or const" for k in schema if k in _BESIDE_ENUM)
        if kinds is None and not any(k in schema for k in ("anyOf", "oneOf", "allOf", "$ref")):
            # a value of any type: its strings or numbers would not be bounded
            said.update(f"{k} without a type" for k in schema if k in _STRING_WORDS or k in _BOUNDS)
        fmt = schema.get("format") if isinstance(schema.get("format"), str) else None
        if kinds == {"string"} and (isinstance(schema.get("pattern"), str) or fmt in FORMATS):
            said.update(f"{k} beside a pattern or format" for k in ("minLength", "maxLength") if k in schema)
        if kinds == {"string"} and "format" in schema and fmt not in FORMATS:
            said.add(f"format {schema['format']!r}")
        props = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
        for name in schema.get("required") if isinstance(schema.get("required"), list) else ():
            if not isinstance(name, str) or name not in props:
                said.add(f"required {name!r} (not in properties)")
        if props and not all(_PLAIN.fullmatch(k) for k in props):
            said.add("property names with quotes, backslashes or control characters")

    def _ref(self, ref: str, ctx: _Reading) -> int:
        """The node of ``$ref`` (a JSON pointer into the root, ``#/$defs/Name``); one node per
        reference, made before what it refers to is read, so a recursive schema ends."""
        if ref not in ctx.refs:
            target = _pointer(ctx.root, ref)
            if target is None and (ref == "#" or ref.startswith("#/")):
                raise SchemaError(f"a JSON schema's $ref {ref!r} points to nothing in the schema")
            if target is None:  # another document's, or an anchor's ("#item"): not read here
                self.unread.add(f"$ref {ref!r}")
                return self._add(ANY)
            ctx.refs[ref] = len(self.nodes)
            self.nodes.append(("ref", None))
            self.nodes[ctx.refs[ref]] = ("ref", self._read(target, ctx))
        return ctx.refs[ref]

    def _add(self, node: tuple) -> int:
        """``node``'s index (one index per distinct node)."""
        if node not in self._ids:
            self._ids[node] = len(self.nodes)
            self.nodes.append(node)
        return self._ids[node]

    def _entries(self, n: int) -> tuple[int, ...]:
        """The nodes a value of node ``n`` may begin as: ``n`` itself, or through references and
        unions the nodes that are neither (ANY alone where one is ANY, or where a reference
        leads only to itself)."""
        out, todo, seen = set(), [n], set()
        while todo:
            m = todo.pop()
            if m not in seen:
                seen.add(m)
                node = self.nodes[m]
                if node[0] in ("ref", "union"):
                    todo.extend(node[1:] if node[0] == "ref" else node[1])
                else:
                    out.add(m)
        anything = self._add(ANY)
        return (anything,) if anything in out or not out else tuple(sorted(out))

    def _enter(self, n: int, then: State) -> State:
        """The state of a value of node ``n``: one ``sv`` state, or an ``alt`` of several."""
        return alt(("sv", m, then) for m in self._entries(n))

    # -- characters --------------------------------------------------------------------------
    def _char(self, state: State, ch: str) -> State | None:
        """The state after character ``ch`` (None: it may not come here)."""
        kind = state[0]
        if kind == "alt":  # ("alt", states): a value that may still be of any of several nodes
            return alt(s for s in (self._char(x, ch) for x in state[1]) if s is not None)
        if kind == "lit":
            text, then = state[1], state[2]
            return None if ch != text[0] else (then if len(text) == 1 else ("lit", text[1:], then))
        if kind == "str":  # ("str", tail, then); tail: the end of the string so far that begins a marker
            if ch == '"':
                return state[2]
            if ch == "\\":
                return ("esc", state[2])
            return None if ord(ch) < 0x20 else self._in_string(state[1] + ch, state[2])
        if kind == "wsrun":  # ("wsrun", indent left, the state the whitespace is in)
            if ch in " \t" and state[1] > 0:
                return ("wsrun", state[1] - 1, state[2])
            return None if ch in WS else self._char(state[2], ch)
        if ch in WS and kind in self.skips_ws:  # JSON's whitespace, as llama.cpp's JSON grammar bounds it
            if ch == "\r":
                return lit("\n", ("wsrun", INDENT, state))
            return ("wsrun", INDENT, state) if ch == "\n" else ("wsrun", 0, state)
        if kind == "ws":
            return self._char(state[1], ch)
        if kind == "space":  # ("space", whitespace left, then)
            if ch in WS:
                return ("space", state[1] - 1, state[2]) if state[1] > 0 else None
            return self._char(state[2], ch)
        if kind == "end":  # ("end", whitespace left): the value is whole; EOS may come
            return ("end", state[1] - 1) if ch in WS and state[1] > 0 else None
        if kind == "key":
            return self._key(state, ch)
        if kind in _SCHEMA_KINDS:
            return self._schema(state, ch)
        if kind in _JSON_KINDS:
            return _json(state, ch, self._char)
        return self._frame(state, ch)

    def _key(self, state: State, ch: str) -> State | None:
        """A key of an object of any keys being written: ``("key", text, string, after)``, its
        text so far (escapes as written), the string's own state (:func:`_json`'s, ending in
        :data:`KEY_END`) and the state after each member, whose ``keys`` it may not repeat (None:
        not counted, :func:`_unkeyed`). Once whole, the member's value: any JSON value, or the
        map's (``mm``)."""
        text, string, after = state[1:]
        keys, nxt = after[-2], self._char(string, ch)
        if nxt != KEY_END:
            return None if nxt is None else ("key", "" if keys is None else text + ch, nxt, after)
        if keys is not None:
            key = json.loads(f'"{text}"')
            if key in keys:
                return None
            after = (*after[:-2], keys | {key}, after[-1])
        value = ("value", after) if after[0] == "members" else ("sv", self.nodes[after[1]][1], after)
        return ("ws", lit(":", value))

    def allowed(self, state: State):
        """As :meth:`CharConstraint.allowed`; where ``state`` holds keys written (:func:`_unkeyed`),
        the mask of the state without them, with the tokens that write a quote read again: only a
        key's closing quote tells the two apart, so a key's every character costs no walk of the
        vocabulary."""
        plain = _unkeyed(state)
        if plain == state:
            return super().allowed(state)
        m = self.mask(plain).copy()
        for t in self._quoting:
            m[t] = self.advance(state, t) is not None
        return m

    @functools.cached_property
    def _quoting(self) -> list[int]:
        """The tokens whose text holds ``"``."""
        return [t for t, units in enumerate(self.texts) if '"' in units]

    def _frame(self, state: State, ch: str) -> State | None:
        """A subclass's own states (what surrounds the JSON values)."""
        raise AssertionError(f"unknown state {state[0]}")

    def _schema(self, state: State, ch: str) -> State | None:
        """A value by its schema node: ``sv`` (a value of node n), an object's ``sk`` (after
        ``{``), ``sm`` (after a member) and ``skey`` (a key being written; ``used``: a bit per
        property written), an array's ``sa`` (after ``[``) and ``se``, an enum's ``choice``, a
        ``number`` or ``integer`` (its text so far)."""
        kind, n, then = state[0], state[1], state[-1]
        if kind in ("number", "integer"):  # (kind, text, then): read to the first other character
            text, pattern = n + ch, _NUMBER if kind == "number" else _INTEGER
            if ch in "0123456789+-.eE" and (pattern.fullmatch(text) or pattern.fullmatch(text + "0")):
                return (kind, text, then)
            return self._char(then, ch) if pattern.fullmatch(n) else None
        node = self.nodes[n]
        if kind == "bounded":  # ("bounded", n, text, then): a number of node n's bounds, read so far
            text = state[2] + ch
            if ch in "0123456789-." and _reaches(node, text):
                return ("bounded", n, text, then)
            return self._char(then, ch) if _within(node, state[2]) else None
        if kind == "sv":
            what = node[0]
            if what == "bounded":
                return ("bounded", n, ch, then) if _reaches(node, ch) else None
            if what == "any":
                return self._char(("value", then), ch)
            if what in ("union", "ref"):
                return self._char(self._enter(n, then), ch)
            if what == "choice":
                return self._char(("choice", n, "", then), ch)
            if what == "object":
                return (("sk", n, 0, then) if node[1] else ("keys", then)) if ch == "{" else None
            if what in ("array", "map"):
                return (("sa" if what == "array" else "mk", n, then)) if ch == "[{"[what == "map"] else None
            if what == "string":
                return ("str", "", then) if ch == '"' else None
            if what == "text":
                return ("text", n, "", then) if ch == '"' else None
            if what in ("number", "integer"):
                return (what, ch, then) if ch == "-" or ch in "0123456789" else None
            literal = "true" if ch == "t" else "false" if ch == "f" else None
            if what == "null":
                literal = "null"
            return ("lit", literal[1:], then) if literal and ch == literal[0] else None
        if kind == "choice":  # ("choice", n, typed, then): one of node n's values, as JSON writes it
            texts, typed = node[1], state[2] + ch
            i = bisect.bisect_left(texts, typed)
            if i < len(texts) and texts[i].startswith(typed):
                longer = i + 1 < len(texts) and texts[i + 1].startswith(typed)
                return then if texts[i] == typed and not longer else ("choice", n, typed, then)
            return self._char(then, ch) if state[2] in texts else None
        if kind in ("sk", "sm"):  # (kind, n, used, then)
            props, required, used = node[1], node[2], state[2]
            done = all(used >> i & 1 for i, (k, _) in enumerate(props) if k in required)
            if ch == "}":
                return then if done else None
            if kind == "sk":
                return ("skey", n, used, "", then) if ch == '"' and used != (1 << len(props)) - 1 else None
            return ("ws", lit('"', ("skey", n, used, "", then))) if ch == "," and used != (1 << len(
                props)) - 1 else None
        if kind == "skey":  # ("skey", n, used, typed, then)
            props, used, typed = node[1], state[2], state[3]
            left = [k for i, (k, _) in enumerate(props) if not used >> i & 1]
            if ch == '"' and typed in left:
                i = [k for k, _ in props].index(typed)
                return ("ws", lit(":", ("sv", props[i][1], ("sm", n, used | 1 << i, then))))
            return ("skey", n, used, typed + ch, then) if begins(left, typed + ch) else None
        if kind == "sa":  # ("sa", n, then): after "["
            item, low, high = node[1:]
            if ch == "]":
                return then if low == 0 else None
            return self._char(("sv", item, ("se", n, 1, then)), ch) if high != 0 else None
        if kind == "se":  # ("se", n, count, then): after an array's count-th item (counted up to its bounds)
            item, low, high, count = *node[1:], state[2]
            if ch == ",":
                more = high is None or count < high
                return ("sv", item, ("se", n, min(count + 1, high or low), then)) if more else None
            return then if ch == "]" and count >= low else None
        if kind == "text":  # ("text", n, value, then): a string of node n, its value so far (escapes read)
            if ch == '"':
                return then if self._text_ok(node, state[2], whole=True) else None
            if ch == "\\":  # where an escape may go on
                value = state[2]
                escaped = self._any_char(node, value) or any(self._text(n, value + e, then)
                                                               for e in _ESCAPES.values())
                return ("tesc", n, value, then) if escaped else None
            return None if ord(ch) < 0x20 else self._text(n, state[2] + ch, then)
        if kind == "tesc":  # ("tesc", n, value, then): after a backslash
            if ch in _ESCAPES:
                return self._text(n, state[2] + _ESCAPES[ch], then)
            return ("thex", n, state[2], "", then) if ch == "u" and self._any_char(node, state[2]) else None
        if kind == "thex":  # ("thex", n, value, digits, then): in \uXXXX
            if ch not in "0123456789abcdefABCDEF":
                return None
            digits = state[3] + ch
            return ("thex", n, state[2], digits, then) if len(digits) < 4 else \
                self._text(n, _joined(state[2], chr(int(digits, 16))), then)
        if kind == "mk":  # ("mk", n, then): a map's members after "{"
            return _members(ch, ("mm", n, frozenset(), then), first=True)
        if kind == "mm":  # ("mm", n, keys, then): after a member, the keys written so far
            return _members(ch, state)
        raise AssertionError(f"unknown state {kind}")

    def _text(self, n: int, value: str, then: State) -> State | None:
        """In a string of node n (a ``("text", patterns, min, max)``) whose value so far is
        ``value``: None where no longer string of the node begins so (or it holds a marker)."""
        if any(m in value for m in self.marker_texts) or not self._text_ok(self.nodes[n], value, whole=False):
            return None
        return ("text", n, value, then)

    @staticmethod
    def _any_char(node: tuple, value: str) -> bool:
        """Whether any character may follow ``value`` in a string of the node (no pattern, and
        room left, or a surrogate pair's second half to come): only then may it be written as
        ``\\uXXXX``, whose first digits cannot tell whether a pattern would take it."""
        return not node[1] and (node[3] is None or len(value) < node[3] or _high_surrogate(value[-1:]))

    @staticmethod
    def _text_ok(node: tuple, value: str, whole: bool) -> bool:
        """Whether ``value`` is a whole string of the node, or (``whole`` False) begins one."""
        patterns, low, high = node[1:]
        if high is not None and len(value) > high or whole and len(value) < low:
            return False
        return all(p.search(value, partial=not whole) for p in patterns)

    def _in_string(self, text: str, then: State) -> State | None:
        """Inside a string after ``text``: None where it ends with one of the format's markers (a
        call's text must not hold one: the reply's reader would end the call there)."""
        if any(text.endswith(m) for m in self.marker_texts):
            return None
        for i in range(len(text)):
            if any(m.startswith(text[i:]) for m in self.marker_texts):
                return ("str", text[i:], then)
        return ("str", "", then)

    def may_end(self, state: State) -> bool:
        """Where the value is whole: a number or an enum's value may end the text as it stands."""
        kind = state[0]
        if kind == "alt":
            return any(self.may_end(s) for s in state[1])
        if kind in ("number", "integer"):
            pattern = _NUMBER if kind == "number" else _INTEGER
            return bool(pattern.fullmatch(state[1])) and self.may_end(state[2])
        if kind == "choice":
            return state[2] in self.nodes[state[1]][1] and self.may_end(state[3])
        if kind == "bounded":
            return _within(self.nodes[state[1]], state[2]) and self.may_end(state[3])
        return self._whole(state)

    def _whole(self, state: State) -> bool:
        """Whether ``state`` is after the text's last value (a subclass's own end)."""
        return state[0] == "end"


# the states whose JSON part may begin with whitespace (it does not change them)
_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}
# the formats read as patterns (RFC 3339's dates and times, and the shapes of the others; \Z, since
# $ would match before a last line break)
_LEAP = "([0-9]{2}(0[48]|[2468][048]|[13579][26])|(0[48]|[2468][048]|[13579][26])00)"
_DATE = (f"([0-9]{{4}}-((0[13578]|1[02])-(0[1-9]|[12][0-9]|3[01])|(0[469]|11)-(0[1-9]|[12][0-9]|30)"
         f"|02-(0[1-9]|1[0-9]|2[0-8]))|{_LEAP}-02-29)")  # the days each month has
_TIME = ("([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\\.[0-9]{1,9})?"
         "([Zz]|[+-]([01][0-9]|2[0-3]):[0-5][0-9])")
_IPV4 = "(25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])"
FORMATS = {
    "date": f"^{_DATE}\\Z", "time": f"^{_TIME}\\Z", "date-time": f"^{_DATE}[Tt]{_TIME}\\Z",
    "uuid": "^[0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}\\Z",
    "email": "^[A-Za-z0-9._%+-]{1,64}@[A-Za-z0-9-]{1,63}(\\.[A-Za-z0-9-]{1,63})+\\Z",
    "ipv4": f"^({_IPV4}\\.){{3}}{_IPV4}\\Z",
    "uri": "^[A-Za-z][A-Za-z0-9+.-]*:[^\\s\"<>\\\\^`{|}]+\\Z"}


def _text_node(schema: dict) -> tuple:
    """A string with ``pattern`` (searched, as JSON Schema reads it), a ``format`` of
    :data:`FORMATS`, ``minLength`` and ``maxLength`` (in characters): ``("text", patterns, min,
    max)``. ValueError for a pattern that is not a regular expression."""
    import regex

    fmt = schema.get("format") if isinstance(schema.get("format"), str) else None
    texts = [t for t in (schema.get("pattern"), FORMATS.get(fmt)) if isinstance(t, str)]
    try:  # \d is [0-9] and $ the end only, as ECMA-262's
        patterns = tuple(regex.compile(_ecma_end(t), regex.ASCII) for t in texts)
    except regex.error as e:
        raise ValueError(f"a JSON schema's pattern {texts[0]!r} is not a regular expression ({e})") from None
    if patterns:  # lengths beside a pattern are not read (JSONGrammar._unread): together they could
        return ("text", patterns, 0, None)  # leave a value that matches so far no room to end
    return ("text", patterns, schema.get("minLength", 0), schema.get("maxLength"))


def _ecma_end(pattern: str) -> str:
    """``pattern`` with each ``$`` outside a class and not escaped as ``\\Z``: ECMA-262's ``$`` is
    the end of the text, Python's also a line break before it."""
    out, escaped, in_class = [], False, False
    for ch in pattern:
        if not escaped and not in_class and ch == "$":
            ch = "\\Z"
        elif not escaped and ch in "[]":
            in_class = ch == "["
        escaped = not escaped and ch == "\\"
        out.append(ch)
    return "".join(out)


def _merged(base: dict, more: dict) -> dict:
    """Two schemas a value must both meet, as one where they do not clash: their ``properties``
    together, their ``required`` together, any other keyword of ``more`` over ``base``'s."""
    out = {**base, **more}
    if isinstance(base.get("properties"), dict) and isinstance(more.get("properties"), dict):
        out["properties"] = {**base["properties"], **more["properties"]}
    if isinstance(base.get("required"), list) and isinstance(more.get("required"), list):
        out["required"] = [*base["required"], *(r for r in more["required"] if r not in base["required"])]
    return out


_BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
_COUNTS = (("minLength", "maxLength"), ("minItems", "maxItems"), ("minProperties", "maxProperties"))
_STRING_WORDS = ("pattern", "format", "minLength", "maxLength")
# keywords an enum's or a const's values are not checked against (_meets checks the others)
_BESIDE_ENUM = frozenset({"pattern", "format", "items", "properties", "required", "additionalProperties",
                          "minItems", "maxItems"})
# keywords whose value must be of a kind: (keyword, the check, what it must be)
_KINDS_OF = (
    ("required", lambda v: isinstance(v, list) and all(isinstance(n, str) for n in v), "a list of names"),
    ("properties", lambda v: isinstance(v, dict) and all(isinstance(s, (dict, bool)) for s in v.values()),
     "an object of schemas"),
    ("additionalProperties", lambda v: isinstance(v, (dict, bool)), "a schema or a boolean"),
    ("items", lambda v: isinstance(v, (dict, bool, list)), "a schema"),
    ("enum", lambda v: isinstance(v, list) and v, "a non-empty list"),
    *((k, lambda v: isinstance(v, list) and v and all(isinstance(s, (dict, bool)) for s in v),
       "a non-empty list of schemas") for k in ("anyOf", "oneOf", "allOf")),
    ("type", lambda v: isinstance(v, str) or isinstance(v, list) and v, "a type or a non-empty list of them"),
    ("$defs", lambda v: isinstance(v, dict), "an object of schemas"),
    ("format", lambda v: isinstance(v, str), "a string"),
)
# what constrains a value beside a $ref (annotations such as title or description do not)
_CONSTRAINING = frozenset({"type", "properties", "required", "items", "enum", "const", "anyOf", "oneOf",
                           "allOf", "additionalProperties", *_BOUNDS, *_STRING_WORDS})
_DECIMAL = re.compile(r"-?(?:0|[1-9]\d{0,15})(?:\.\d{1,16})?")  # a bounded number: no exponent
_STEP = Fraction(1, 10**16)  # the finest step a bounded number's 16 fraction digits write


def _finite(v) -> bool:
    """A JSON number, not a boolean: an integer (of any size, which a float would overflow) or a
    finite float."""
    return isinstance(v, int) and not isinstance(v, bool) or isinstance(v, float) and math.isfinite(v)


def _check_values(schema: dict) -> None:
    """:class:`SchemaError` where a keyword's value is not of its kind (``"minimum": "5"``) or a
    pair of counts leaves no value (``minLength`` above ``maxLength``): OpenAI answers such a
    schema with a 400, and a grammar of it would leave the model no token to write."""
    for k in _BOUNDS:
        v = schema.get(k)
        if k in schema and not (_finite(v) or k.startswith("exclusive") and isinstance(v, bool)):
            draft4 = " (or, as draft 4 writes it, true or false)" if k.startswith("exclusive") else ""
            raise SchemaError(f"a JSON schema's {k} must be a number{draft4}, not {v!r}")
    for pair in _COUNTS:
        for k in pair:
            v = schema.get(k)
            if k in schema and not (isinstance(v, int) and not isinstance(v, bool) and v >= 0):
                raise SchemaError(f"a JSON schema's {k} must be a whole number of at least 0, not {v!r}")
        low, high = (schema.get(k) for k in pair)
        if low is not None and high is not None and low > high:
            raise SchemaError(f"a JSON schema's {pair[0]} {low} is above its {pair[1]} {high}: no value "
                              "meets both")
    if "pattern" in schema and not isinstance(schema["pattern"], str):
        raise SchemaError(f"a JSON schema's pattern must be a string, not {schema['pattern']!r}")
    for k, ok, what in _KINDS_OF:
        if k in schema and not ok(schema[k]):
            raise SchemaError(f"a JSON schema's {k} must be {what}, not {schema[k]!r}")


def _bounds(schema: dict) -> tuple:
    """``(low, low excluded, high, high excluded)`` as Fractions (None: no bound), from
    ``minimum``/``maximum`` and ``exclusiveMinimum``/``exclusiveMaximum`` (a number, or draft 4's
    true beside ``minimum``/``maximum``)."""
    def number(v):
        return Fraction(str(v)) if _finite(v) else None

    out = []
    for bound, excluded, pick in (("minimum", "exclusiveMinimum", max), ("maximum", "exclusiveMaximum", min)):
        value, strict = number(schema.get(bound)), schema.get(excluded)
        if strict is True:  # draft 4
            out += [value, value is not None]
        elif number(strict) is not None and (value is None or pick(value, number(strict)) == number(strict)):
            out += [number(strict), True]
        else:
            out += [value, False]
    return tuple(out)


def _grid(node: tuple) -> tuple[Fraction, Fraction | None, Fraction | None]:
    """A bounded node's step (1 for integers) and its lowest and highest values on that step."""
    integer, low, low_out, high, high_out = node[1:]
    step = Fraction(1) if integer else _STEP
    lowest = highest = None
    if low is not None:
        lowest = math.ceil(low / step) * step
        lowest += step if low_out and lowest == low else 0
    if high is not None:
        highest = math.floor(high / step) * step
        highest -= step if high_out and highest == high else 0
    return step, lowest, highest


def _reaches(node: tuple, text: str) -> bool:
    """Whether a number of the node's bounds begins with ``text`` (no exponent; at most 16 digits
    a part): the numbers that begin so are runs ``[a, b)`` (``12`` begins 12-12.99…, 120-129.99…,
    ...), mirrored for a minus sign, each tried at its end nearest the bounds."""
    if not (_DECIMAL.fullmatch(text) or _DECIMAL.fullmatch(text + "0")) or node[1] and "." in text:
        return False
    step, lowest, highest = _grid(node)
    negative = text.startswith("-")
    whole, dot, fraction = text.lstrip("-").partition(".")
    if dot:
        a = Fraction(whole + "." + fraction) if fraction else Fraction(whole)
        runs = [(a, a + Fraction(1, 10 ** len(fraction)))]
    elif not whole:
        runs = [(Fraction(0), Fraction(10**16))]
    else:
        runs = [(Fraction(int(whole) * 10**k), Fraction((int(whole) + 1) * 10**k))
                for k in range(1 if whole == "0" else 17 - len(whole))]
    for a, b in runs:
        if not negative:
            v = a if lowest is None else max(a, lowest)
            if v <= b - step and (highest is None or v <= highest):
                return True
        else:
            v = -a if highest is None else min(-a, highest)
            if v >= step - b and (lowest is None or v >= lowest):
                return True
    return False


def _within(node: tuple, text: str) -> bool:
    """Whether ``text`` is a whole number within the node's bounds."""
    if not (_INTEGER if node[1] else _DECIMAL).fullmatch(text):
        return False
    _, lowest, highest = _grid(node)
    v = Fraction(text)
    return (lowest is None or v >= lowest) and (highest is None or v <= highest)


KEY_END = ("key end",)  # where a key's string closes (JSONGrammar._key reads on)
SKIPS_WS = frozenset({"ws", "keys", "members", "value", "items", "elements", "sv", "sk", "sm", "sa", "se",
                      "mk", "mm"})
_JSON_KINDS = frozenset({"keys", "members", "value", "items", "elements", "esc", "hex"})
_SCHEMA_KINDS = frozenset({"sv", "sk", "sm", "skey", "sa", "se", "mk", "mm", "choice", "number", "integer",
                           "text", "tesc", "thex", "bounded"})


def _high_surrogate(ch: str) -> bool:
    return len(ch) == 1 and 0xD800 <= ord(ch) <= 0xDBFF


def _joined(value: str, ch: str) -> str:
    """``value`` and the character of a ``\\uXXXX`` escape: a surrogate pair's halves (JSON's
    ``\\ud83d\\ude00``) joined into the one character they stand for, as lengths count it."""
    if _high_surrogate(value[-1:]) and 0xDC00 <= ord(ch) <= 0xDFFF:
        return value[:-1] + chr(0x10000 + (ord(value[-1]) - 0xD800 << 10) + ord(ch) - 0xDC00)
    return value + ch


def _enum(schema: dict) -> tuple[str, ...] | None:
    """A schema's ``const`` or ``enum`` values that its ``type``, bounds and lengths allow
    (:func:`_meets`), as JSON writes them, sorted (a number both as an integer and with ``.0``
    where it is whole, as JSON Schema counts them equal; an object or an array as ``json.dumps``
    writes it, one of the texts of that value); None where it has neither, empty where a value is
    one JSON cannot write (NaN, an infinity) or none is allowed (:func:`_never`)."""
    values = _listed(schema)
    if values is None:
        return None
    texts = set()
    for v in [v for v in values if _meets(v, schema)]:
        try:
            texts.add(json.dumps(v, ensure_ascii=False, allow_nan=False))
        except (TypeError, ValueError):
            return ()
        number = isinstance(v, (int, float)) and not isinstance(v, bool) and abs(v) < 1e300
        if number and float(v).is_integer():
            texts |= {json.dumps(int(v)), json.dumps(float(v))}
    return tuple(sorted(texts))


def _never(schema: dict) -> bool:
    """Whether ``schema`` has an ``enum`` or ``const`` none of whose values :func:`_meets` it."""
    values = _listed(schema)
    return bool(values) and not any(_meets(v, schema) for v in values)


def _listed(schema: dict) -> list | None:
    """A schema's ``const`` (as one value) or ``enum`` values; None where it has neither."""
    values = [schema["const"]] if "const" in schema else schema.get("enum")
    return values if isinstance(values, list) else None


def _refuse_enum(schema: dict):
    """The :class:`SchemaError` of a schema that no value of its enum (or const) meets."""
    raise SchemaError(f"a JSON schema allows none of its {'const' if 'const' in schema else 'enum'} values "
                      "(its type, bounds or lengths rule them out)")


def _json_type(v) -> str:
    """The JSON Schema type of a Python value from JSON (a whole float is an integer)."""
    if v is None or isinstance(v, bool):
        return "null" if v is None else "boolean"
    if isinstance(v, (int, float)):
        return "integer" if isinstance(v, int) or math.isfinite(v) and v.is_integer() else "number"
    return {str: "string", list: "array", dict: "object"}.get(type(v), "unknown")


def _meets(v, schema: dict) -> bool:
    """Whether ``schema``'s ``type``, numeric bounds and string lengths allow the value ``v``
    (what an ``enum`` or ``const`` beside them must also meet; its other keywords are listed as
    not read, :meth:`JSONGrammar._unread`)."""
    kinds = schema.get("type")
    kinds = set(kinds) if isinstance(kinds, list) else {kinds} if isinstance(kinds, str) else None
    kind = _json_type(v)
    if kinds is not None and kind not in kinds and not (kind == "integer" and "number" in kinds):
        return False
    if kind in ("integer", "number") and isinstance(v, (int, float)) and math.isfinite(v):
        low, low_out, high, high_out = _bounds(schema)
        x = Fraction(str(v)) if isinstance(v, float) else Fraction(v)
        if low is not None and (x < low or x == low and low_out) or high is not None and (
                x > high or x == high and high_out):
            return False
    if kind == "string":
        low, high = schema.get("minLength"), schema.get("maxLength")
        return (low is None or len(v) >= low) and (high is None or len(v) <= high)
    return True


MAX_ALTS = 64  # alternatives an alt state keeps (each keeps its own stack: nested unions multiply them)


def alt(states) -> State | None:
    """One state for several the text may be in (None: none). Past :data:`MAX_ALTS` the first by
    their text are kept: what is allowed narrows, and stays valid (every state kept can end)."""
    states = frozenset(x for s in states for x in (s[1] if s[0] == "alt" else (s,)))  # flat: no alt in an alt
    if len(states) > MAX_ALTS:
        states = frozenset(sorted(states, key=repr)[:MAX_ALTS])
    return None if not states else next(iter(states)) if len(states) == 1 else ("alt", states)


def _pointer(root, ref: str):
    """What a ``$ref`` within the document points to (``#``, ``#/$defs/Item``; JSON pointer
    escapes ``~0``, ``~1`` and percent-encoding); None where it points to nothing."""
    if not ref.startswith("#"):
        return None
    target = root
    for part in filter(None, urllib.parse.unquote(ref[1:]).split("/")):
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(target, dict) and part in target:
            target = target[part]
        elif isinstance(target, list) and part.isdigit() and int(part) < len(target):
            target = target[int(part)]
        else:
            return None
    return target


def lit(text: str, then: State) -> State:
    """``text`` exactly, then ``then``."""
    return ("lit", text, then) if text else then


def begins(words: list[str], prefix: str) -> bool:
    """Whether one of the sorted ``words`` begins with ``prefix``."""
    i = bisect.bisect_left(words, prefix)
    return i < len(words) and words[i].startswith(prefix)


def _members(ch: str, after: State, first: bool = False) -> State | None:
    """An object's members, after ``{`` (``first``) or after a member: a key (a string none of
    the members has written, :meth:`JSONGrammar._key`), ``:`` and a value, apart by ``,``.
    ``after``: the state after each member, ``(kind, ..., keys, then)``; ``then`` after ``}``."""
    if ch == "}":
        return after[-1]
    key = ("key", "", ("str", "", KEY_END), after)
    if first:
        return key if ch == '"' else None
    return ("ws", lit('"', key)) if ch == "," else None


def _unkeyed(state: State) -> State:
    """``state`` with the keys written so far forgotten and no longer counted (a key's text, the
    ``keys`` of ``members`` and ``mm``: None): it allows the same tokens, but for those that close
    a key."""
    if isinstance(state, Partial):
        return Partial(state.head, _unkeyed(state.state))
    kind = state[0]
    if kind == "alt":
        return alt(map(_unkeyed, state[1]))
    if kind == "key":
        return ("key", "", state[2], _unkeyed(state[3]))
    if kind in ("members", "mm"):
        return (*state[:-2], None, _unkeyed(state[-1]))
    return (*state[:-1], _unkeyed(state[-1])) if len(state) > 1 and isinstance(state[-1], tuple) else state


def _json(state: State, ch: str, char) -> State | None:
    """Any JSON value: ``value``, an object's ``keys`` (after ``{``) and ``members`` (after a
    member), an array's ``items`` (after ``[``) and ``elements``, a string's escapes ``esc`` and
    ``hex``. ``char`` reads a character in another state (a number's, an array's first value)."""
    kind, then = state[0], state[-1]
    if kind == "keys":  # ("keys", then): after "{"
        return _members(ch, ("members", frozenset(), then), first=True)
    if kind == "members":  # ("members", keys, then): after a member, the keys written so far
        return _members(ch, state)
    if kind == "value":
        if ch == "{":
            return ("keys", then)
        if ch == "[":
            return ("items", then)
        if ch == '"':
            return ("str", "", then)
        if ch == "-" or ch in "0123456789":
            return ("number", ch, then)
        return ("lit", _LITERALS[ch], then) if ch in _LITERALS else None
    if kind == "items":
        return then if ch == "]" else char(("value", ("elements", then)), ch)
    if kind == "elements":
        return ("value", ("elements", then)) if ch == "," else (then if ch == "]" else None)
    if kind == "esc":
        if ch in '"\\/bfnrt':
            return ("str", "", then)
        return ("hex", 4, then) if ch == "u" else None
    if kind == "hex":
        if ch not in "0123456789abcdefABCDEF":
            return None
        return ("str", "", then) if state[1] == 1 else ("hex", state[1] - 1, then)
    raise AssertionError(f"unknown state {kind}")


class JSONValue(JSONGrammar):
    """Text that is one JSON value of ``schema`` (None: any JSON object), then EOS."""

    def __init__(self, tokenizer, schema: dict | None):
        super().__init__(tokenizer)
        root = self._node(schema, top=schema is None)
        self.start = ("space", SPACE_AROUND, ("sv", root, ("end", SPACE_AROUND)))


def json_constraint(tokenizer, schema: dict | None = None) -> JSONValue:
    """The constraint under which a reply is one JSON value that ``schema`` allows (None: any JSON
    object); for ``generate(..., constraint=...)``. Requests with the same schema share one, and
    its cached masks."""
    check_reads_tokens(tokenizer, "json_constraint")
    if schema is not None and not isinstance(schema, dict):
        raise SchemaError("a JSON schema must be an object")
    return _shared(tokenizer, json.dumps(schema, sort_keys=True))


_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")  # a response format's name, as OpenAI's


def response_constraint(tokenizer, response_format) -> JSONValue | None:
    """The constraint of OpenAI's ``response_format``: None for ``{"type": "text"}`` (or None), any
    JSON object for ``{"type": "json_object"}``, the schema's values for ``{"type": "json_schema",
    "json_schema": {"name": ..., "schema": {...}}}``. ValueError for anything else."""
    kind = response_format.get("type") if isinstance(response_format, dict) else None
    if response_format is None or kind == "text":
        return None
    if kind == "json_object":
        return json_constraint(tokenizer)
    spec = response_format.get("json_schema") if kind == "json_schema" else None
    if isinstance(spec, dict) and not (isinstance(spec.get("name"), str) and _NAME.fullmatch(spec["name"])):
        raise ValueError("response_format.json_schema needs a 'name' of letters, digits, underscores and "
                         "dashes, at most 64 (OpenAI's rule)")
    if not isinstance(spec, dict) or not isinstance(spec.get("schema", {}), dict):
        raise ValueError("response_format must be {\"type\": \"text\"}, {\"type\": \"json_object\"} or "
                         "{\"type\": \"json_schema\", \"json_schema\": {\"name\": ..., \"schema\": {...}}}")
    if spec.get("strict") is True:
        return strict_constraint(tokenizer, spec.get("schema", {}), "response_format: a strict schema")
    return json_constraint(tokenizer, spec.get("schema", {}))


def strict_constraint(tokenizer, schema: dict, what: str) -> JSONValue:
    """The constraint of ``schema`` where it is strict (OpenAI's: the output follows it), so none
    of its keywords may go unenforced: ValueError naming them, ``what`` saying whose schema."""
    shaped = json_constraint(tokenizer, schema)
    if shaped.unread:
        raise ValueError(f"{what} may not use {', '.join(sorted(shaped.unread))}: this server does not "
                         "enforce it")
    return shaped


@functools.lru_cache(maxsize=16)
def _shared(tokenizer, schema: str) -> JSONValue:
    return JSONValue(tokenizer, json.loads(schema))
