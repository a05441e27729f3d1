"""JSON by a schema, as a token constraint (``json_constraint``, OpenAI's ``response_format``,
``generate --json-schema``): the oracle is ``jsonschema``, on texts the constraint allows and on
texts it refuses; decoding under it is exact (Speculative Streaming with a lossless adapter writes
what plain decoding of the base writes under the same constraint)."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from helpers import Server, drawn_texts, templated_model

from mlx_specstream import generate, load
from mlx_specstream.api import DEFAULT_MODEL
from mlx_specstream.constraint import DONE
from mlx_specstream.json_grammar import SchemaError, json_constraint, response_constraint

jsonschema = pytest.importorskip("jsonschema")

# what the constraint reads of a schema (no other properties where a schema does not say:
# the constraint's rule, llama.cpp's too)
SCHEMA = {"type": "object", "required": ["zone", "days"], "additionalProperties": False, "properties": {
    "zone": {"enum": ["CET", "UTC", 1]}, "dst": {"type": "null"}, "x": {"type": "object"},
    "n": {"type": "integer"}, "ok": {"type": "boolean"}, "any": {"description": "any JSON value"},
    "days": {"type": "array", "items": {"type": "number"}}, "city": {"type": "string"},
    "where": {"type": "object", "additionalProperties": False, "properties": {"lat": {"type": "number"}}}}}
CASES = [
    {"zone": "UTC", "days": []}, {"days": [1, 2.5, -3e-2, 0], "zone": 1, "city": "São\tPaulo"},
    {"zone": "CET", "days": [7], "n": -12, "x": {"a": [1, {"b": None}]}, "ok": True, "any": [1, "q"],
     "where": {"lat": 59.9}, "dst": None},
    {"days": [1]}, {"zone": "PST", "days": []}, {"zone": "CET", "days": [], "n": 1.5},
    {"zone": "CET", "days": [], "dst": 0}, {"zone": "CET", "days": [], "ok": "yes"},
    {"zone": "CET", "days": ["1"]}, {"zone": "CET", "days": [], "extra": 1},
    {"zone": "CET", "days": [], "where": {"lat": 1, "lon": 2}}, {"zone": "CET", "days": [], "city": 3},
]


@pytest.fixture(scope="module")
def tok():
    return load(DEFAULT_MODEL)[1]


def reads(c, tok, text: str) -> bool:
    """Whether ``text``, tokenized, then EOS, is a reply ``c`` allows."""
    end = c.walk(c.start, tok.encode(text, add_special_tokens=False))
    return end is not None and c.advance(end, tok.eos_token_id) is DONE


def test_a_value_is_allowed_where_the_schema_allows_it(tok):
    c = json_constraint(tok, SCHEMA)
    for value in CASES:
        valid = jsonschema.Draft202012Validator(SCHEMA).is_valid(value)
        for indent in (None, 2, "\t"):
            text = json.dumps(value, indent=indent, ensure_ascii=False)
            assert reads(c, tok, text) == valid, (text, valid)
            assert reads(c, tok, f" {text}\n") == valid  # up to two whitespace characters around it
    text = json.dumps(CASES[0])
    assert not reads(c, tok, "Sure: " + text) and not reads(c, tok, text + " ok")
    assert not reads(c, tok, text[:-1])  # the end of the text inside the value
    assert not reads(c, tok, '{"zone": "CET", "zone": "UTC", "days": []}')  # a property twice
    assert not reads(c, tok, '{"zone": "CET", "days": []\n\n}')  # a blank line
    assert reads(c, tok, '{"zone": "CET", "days": [],\n' + " " * 20 + '"city": "a\\u00e9\\n"}')
    assert not reads(c, tok, '{"zone": "CET", "days": [],\n' + " " * 21 + '"city": "a"}')  # llama.cpp's bound
    # found by a review: a value that ends the text as it stands, numbers JSON allows, whitespace
    # JSON allows, names and values outside ASCII (however the tokenizer cuts them), false schemas
    for schema, text, allowed in [
            ({"type": "number"}, "42", True), ({"type": "integer"}, "-7", True), ({}, "3", True),
            ({"enum": [1, 10]}, "1", True), ({"enum": [1, 10]}, "10", True),
            ({"type": "number"}, "1e05", True),
            ({"const": 1.0}, "1", True), ({"const": 2}, "2.0", True), ({"enum": [1, 10]}, "2", False),
            ({"enum": ["日本", "x"]}, '"日本"', True), ({"enum": ["日本"]}, '"日"', False),
            ({"properties": {"é": {"type": "string"}}, "required": ["é"]}, '{"é": "x"}', True),
            ({"properties": {"a": False, "b": {}}}, '{"a": 1}', False),
            ({"type": "object"}, '{\t"a": 1,\r\n  "b": 2}', True),
            ({"enum": [float("nan"), 1]}, "NaN", False)]:
        assert reads(json_constraint(tok, schema), tok, text) is allowed, (schema, text)
    c = json_constraint(tok, {"enum": ["日本"]})
    assert c.mask(c.walk(c.start, tok.encode('"', add_special_tokens=False))).any()
    # found by a new user: byte tokens once read as any byte, so `"thö"` passed for `"thé"`, and
    # `"` written as a byte token after a character's first byte ended a string the decoder drops
    by_byte = {b: tok.token_to_id(f"<0x{b:02X}>") for b in range(256)}  # the byte tokens
    c = json_constraint(tok, {"enum": ["café", "thé"]})
    head = c.walk(c.start, tok.encode('"th', add_special_tokens=False))
    for ch, ok in (("é", True), ("ö", False)):
        state = c.walk(head, [*(by_byte[b] for b in ch.encode()), *tok.encode('"', add_special_tokens=False)])
        assert (state is not None and c.may_end(state)) is ok, ch
    c = json_constraint(tok, {"type": "string"})
    opened = c.walk(c.start, tok.encode('"a', add_special_tokens=False))
    assert c.walk(opened, [by_byte[0xC3], by_byte[0x22]]) is None
    assert c.walk(opened, [by_byte[0x22]]) is not None  # the byte alone is a quote
    # found by a review: ED A0-BF begins a surrogate, which UTF-8 does not write; ED 9E 98 is 힘
    assert c.walk(opened, [by_byte[0xED], by_byte[0xA0]]) is None
    assert c.mask(c.walk(opened, [by_byte[0xED]])).any()
    assert c.walk(opened, [by_byte[b] for b in "힘".encode()]) is not None
    hangul = json_constraint(tok, {"type": "string", "pattern": "^[éè가-힣]+$"})  # the pattern's characters
    for text in ("é", "김"):
        assert hangul.walk(hangul.start, [by_byte[0x22], *(by_byte[b] for b in text.encode())]) is not None
    odd = json_constraint(tok, {"allOf": [{"type": "string"}, {"type": "null"}], "required": []})  # any
    assert reads(odd, tok, "[1]") and reads(odd, tok, '"a"')
    for invalid in ({"required": [{}]}, {"type": []}):  # not JSON schemas (their meta-schema's rules)
        with pytest.raises(SchemaError):
            json_constraint(tok, invalid)
    any_object = json_constraint(tok)  # OpenAI's json_object: any object
    assert reads(any_object, tok, '{"a": [1, {"b": null}], "c": "d"}') and not reads(any_object, tok, "[1]")
    assert response_constraint(tok, {"type": "json_object"}) is any_object
    assert response_constraint(tok, {"type": "text"}) is None and response_constraint(tok, None) is None
    with pytest.raises(ValueError, match="response_format must be"):
        response_constraint(tok, {"type": "json_schema"})
    for name in ({}, {"name": ""}, {"name": "a b"}, {"name": "x" * 65}):  # OpenAI's rule (a walkthrough
        with pytest.raises(ValueError, match="needs a 'name'"):  # found it unchecked)
            response_constraint(tok, {"type": "json_schema", "json_schema": {**name, "schema": {}}})
    with pytest.raises(ValueError, match="type must be one of string, .*, not 'str'"):
        json_constraint(tok, {"properties": {"a": {"type": ["null", "str"]}}})
    # a strict schema with keywords the grammar does not enforce is refused, as OpenAI refuses them
    counted = {"type": "object", "properties": {"n": {"type": "integer", "multipleOf": 2},
                                                "at": {"type": "string", "format": "hostname"}}}
    spec = {"type": "json_schema", "json_schema": {"name": "c", "schema": counted}}
    assert response_constraint(tok, spec).unread == {"multipleOf", "format 'hostname'"}
    with pytest.raises(ValueError, match="a strict schema may not use format 'hostname', multipleOf"):
        response_constraint(tok, {**spec, "json_schema": {**spec["json_schema"], "strict": True}})


# what Pydantic writes for nested, optional, recursive and union fields: $defs and $ref, anyOf,
# lists of types, bounds on an array's length, a map of any keys; jsonschema is the oracle again
NUMBER = {"type": "number"}
STEP = {"type": "object", "additionalProperties": False, "required": ["do"], "properties": {
    "do": {"type": "string"},
    "then": {"anyOf": [{"$ref": "#/$defs/Step"}, {"type": "null"}], "default": None}}}
SCHEMA2 = {"$defs": {"Step": STEP, "Tag": {"enum": ["a", "b"]}}, "type": "object",
           "additionalProperties": False, "required": ["steps", "note"], "properties": {
    "steps": {"type": "array", "items": {"$ref": "#/$defs/Step"}, "minItems": 1, "maxItems": 2},
    "note": {"type": ["string", "null"]}, "tag": {"allOf": [{"$ref": "#/$defs/Tag"}]},
    "counts": {"type": "object", "additionalProperties": {"type": "integer"}},
    "id": {"oneOf": [{"type": "integer"}, {"type": "string"}]},
    "shape": {"anyOf": [
        {"type": "object", "properties": {"r": NUMBER}, "required": ["r"], "additionalProperties": False},
        {"type": "object", "properties": {"w": NUMBER, "h": NUMBER}, "required": ["w", "h"],
         "additionalProperties": False}]},
    "root": {"anyOf": [{"$ref": "#"}, {"type": "boolean"}]}}}
ONE = [{"do": "a"}]
CASES2 = [
    {"steps": ONE, "note": None}, {"steps": [{"do": "a", "then": {"do": "b", "then": None}}], "note": "x"},
    {"steps": [{"do": "a"}, {"do": "b"}], "note": "", "tag": "b", "counts": {"x": 1, "y": -2}, "id": 7,
     "shape": {"w": 1, "h": 2.5}},
    {"steps": [{"do": "a"}], "note": None, "id": "k7", "shape": {"r": 3}, "counts": {},
     "root": {"steps": [{"do": "c"}], "note": None, "root": True}},
    {"steps": [], "note": None}, {"steps": [{"do": "a"}] * 3, "note": None}, {"steps": [{}], "note": None},
    {"steps": [{"do": "a", "then": {"do": "b", "x": 1}}], "note": None}, {"steps": [{"do": "a"}]},
    {"steps": [{"do": "a"}], "note": 1}, {"steps": [{"do": "a"}], "note": None, "tag": "c"},
    {"steps": ONE, "note": None, "counts": {"x": 1.5}}, {"steps": ONE, "note": None, "id": 1.5},
    {"steps": ONE, "note": None, "id": None}, {"steps": ONE, "note": None, "shape": {"w": 1}},
    {"steps": ONE, "note": None, "shape": {"r": 1, "w": 2}},
    {"steps": ONE, "note": None, "root": {"steps": [], "note": None}},
]


def test_references_unions_and_bounds(tok):
    """``$ref`` (recursive too), ``anyOf``/``oneOf`` (objects that differ only after ``{``),
    ``allOf`` of one schema, lists of types, ``minItems``/``maxItems`` and maps, against
    ``jsonschema``; a reference to nothing, or only to itself, leaves the value any JSON."""
    c = json_constraint(tok, SCHEMA2)
    for value in CASES2:
        valid = jsonschema.Draft202012Validator(SCHEMA2).is_valid(value)
        for indent in (None, 2):
            text = json.dumps(value, indent=indent)
            assert reads(c, tok, text) == valid, (text, valid)
    for schema, text, allowed in [
            ({"enum": [{"a": [1, "é"]}, [None]]}, '{"a": [1, "é"]}', True),  # as json.dumps writes them
            ({"type": ["string", "null"], "enum": ["a", "b"]}, '"a"', True),  # the values its types allow
            ({"type": ["string", "null"], "enum": ["a", "b"]}, "null", False),
            ({"type": ["string", "null"], "enum": ["a", None]}, "null", True),
            ({"type": "integer", "enum": [1, 5], "minimum": 3}, "1", False),
            ({"enum": [{"a": [1, "é"]}, [None]]}, "[null]", True), ({"const": {"a": 1}}, '{"a": 2}', False),
            ({"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}, '"x"', True),
            ({"type": "string", "nullable": True}, "null", True),
            ({"type": "string", "nullable": True}, "1", False),
            ({"$defs": {"a~b/c": {"type": "integer"}}, "$ref": "#/$defs/a~0b~1c"}, "1", True),
            ({"$defs": {"a~b/c": {"type": "integer"}}, "$ref": "#/$defs/a~0b~1c"}, '"1"', False),
            ({"type": "array", "maxItems": 0}, "[]", True), ({"type": "array", "maxItems": 0}, "[1]", False),
            ({"anyOf": [{"type": "integer"}, {"enum": [10.5]}]}, "10.5", True),
            ({"anyOf": [{"type": "integer"}, {"enum": [10.5]}]}, "10.25", False)]:
        assert reads(json_constraint(tok, schema), tok, text) is allowed, (schema, text)


STRINGS = {"type": "object", "additionalProperties": False, "properties": {
    "code": {"type": "string", "pattern": "^[A-Z]{2}[0-9]+$"}, "tag": {"type": "string", "pattern": "x[yz]"},
    "d": {"type": "string", "format": "date"}, "u": {"type": "string", "format": "uuid"},
    "ip": {"type": "string", "format": "ipv4"}, "n": {"type": "string", "minLength": 2, "maxLength": 4},
    "at": {"type": "string", "format": "date-time"}}}
UUID = "123e4567-e89b-12d3-a456-426614174000"


def test_patterns_formats_and_lengths(tok):
    """Strings by ``pattern`` (searched, as JSON Schema reads it), ``format`` and
    ``minLength``/``maxLength`` (characters of the value, escapes decoded), against ``jsonschema``
    with its format checker; texts drawn under the constraint pass it too (``date-time`` by
    Python's ISO reader)."""
    import datetime

    check = jsonschema.Draft202012Validator(STRINGS, format_checker=jsonschema.FormatChecker())
    c = json_constraint(tok, STRINGS)
    good = {"code": "AB12", "tag": "__xz__", "d": "2024-02-29", "u": UUID, "ip": "10.0.0.255", "n": "ab",
            "at": "2024-01-01T10:00:00Z"}
    cases = [good, {"n": "aé"}, {"n": "aéé\n"}, {"n": "😀😀😀😀"}, {"n": "😀"}, {"n": "a😀😀😀😀"},
             *({k: v} for k, v in [  # JSON writes é as \u00e9, 😀 as a pair \ud83d\ude00: one character
        ("code", "ab12"), ("code", "AB"), ("tag", "xx"), ("d", "2023-02-29"),
        ("d", "2024-13-01"), ("u", UUID[:-1]), ("ip", "256.1.1.1"), ("n", "a"), ("n", "abcde")])]
    for value in cases:
        text = json.dumps(value)
        assert reads(c, tok, text) == check.is_valid(value), text
    assert not reads(c, tok, '{"at": "2024-01-01 10:00"}')  # RFC 3339: a T, seconds and an offset
    ended = 0
    for ids, done in drawn_texts(c, tok, max_tokens=200):
        if done:
            ended += 1
            value = json.loads(tok.decode(ids))
            check.validate(value)
            if "at" in value:
                assert datetime.datetime.fromisoformat(value["at"]).tzinfo is not None
    assert ended >= 8
    with pytest.raises(ValueError, match="pattern '\\(' is not a regular expression"):
        json_constraint(tok, {"type": "string", "pattern": "("})


BOUNDED = [{"type": "integer", "minimum": 0}, {"type": "integer", "exclusiveMinimum": -3, "maximum": 120},
           {"type": "number", "exclusiveMinimum": 0, "maximum": 1}, {"type": "number", "minimum": -2.5},
           {"type": "integer", "minimum": 10, "maximum": 10}, {"type": "number", "maximum": -0.001}]


def drawn_and_valid(c, tok, schema: dict, n: int) -> int:
    """How many of ``n`` texts drawn through ``c`` end (within 40 tokens); each that ends is JSON
    the ``schema`` allows (the oracle: ``jsonschema``)."""
    ended = 0
    for ids, done in drawn_texts(c, tok, n=n, max_tokens=40, check_masks=False):
        ended += done
        if done:
            jsonschema.validate(json.loads(tok.decode(ids)), schema)
    return ended


def test_numbers_within_bounds(tok):
    """``minimum``, ``maximum`` and their exclusive forms, against ``jsonschema``, on numbers
    written and drawn; no number is begun that cannot end within the bounds."""
    texts = ["0", "-0", "-1", "7", "120", "121", "-2", "-3", "1", "0.5", "1.0", "1.5", "0.0", "-2.5", "-2.6",
             "10", "9", "11", "100", "-0.001", "-0.0009", "-1e1", "3.25"]
    for schema in BOUNDED:
        c = json_constraint(tok, schema)
        for text in texts:
            # written without an exponent, an integer without a fraction (JSON Schema would take 1.0)
            plain = "e" not in text and not (schema["type"] == "integer" and "." in text)
            valid = jsonschema.Draft202012Validator(schema).is_valid(json.loads(text))
            assert reads(c, tok, text) == (valid and plain), (schema, text)
        assert drawn_and_valid(c, tok, schema, n=8) >= 6, schema


def test_schemas_that_no_value_meets_are_refused_where_they_are_read(tok):
    """A keyword of the wrong kind, or bounds that leave no value (none that 16 digits write),
    is a ValueError when the constraint is made (the server's 400), not a model left without a
    token mid-reply; bounds that leave one value are kept, and what is drawn meets them
    (jsonschema)."""
    refused = [({"type": "integer", "minimum": 5, "maximum": 3}, "allows no integer"),
               ({"type": "integer", "exclusiveMinimum": 3, "exclusiveMaximum": 4}, "allows no integer"),
               ({"type": "number", "exclusiveMinimum": 3, "exclusiveMaximum": 3}, "allows no number"),
               ({"type": "number", "minimum": 1e17}, "allows no number of at most 16 digits"),
               ({"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1e-20}, "allows no number"),
               ({"type": "string", "minLength": 5, "maxLength": 2}, "minLength 5 is above its maxLength 2"),
               ({"type": "array", "minItems": 3, "maxItems": 1}, "minItems 3 is above its maxItems 1"),
               ({"type": "integer", "minimum": "5"}, "minimum must be a number, not '5'"),
               ({"type": "string", "minLength": -1}, "minLength must be a whole number of at least 0"),
               ({"type": "array", "maxItems": 1.5}, "maxItems must be a whole number"),
               ({"type": "string", "pattern": 5}, "pattern must be a string"),
               ({"type": "object", "properties": {"a": {"type": "number", "maximum": True}}}, "maximum must"),
               ({"$ref": "#/$defs/none"}, "$ref '#/$defs/none' points to nothing")]
    for schema, said in refused:
        with pytest.raises(ValueError, match=re.escape(said)):
            json_constraint(tok, schema)
    kept = [{"type": "integer", "minimum": 3, "maximum": 3},
            {"type": "integer", "exclusiveMinimum": 2, "exclusiveMaximum": 4},
            {"type": "number", "minimum": 0.5, "exclusiveMaximum": 0.6},
            {"type": "string", "minLength": 2, "maxLength": 2},
            {"type": "array", "minItems": 1, "maxItems": 1,
             "items": {"type": "integer", "minimum": 1, "maximum": 1}}]
    for schema in kept:
        assert drawn_and_valid(json_constraint(tok, schema), tok, schema, n=4) >= 3, schema


def test_schemas_that_multiply_work_stay_bounded(tok):
    """Found by a review: unions whose alternatives share a prefix nest (two node types with
    ``children``: an alt state per level doubled), and ``anyOf`` beside ``properties`` read every
    property again per branch (30 levels: hours). Alternatives are capped, and each distinct part
    of a schema is read once."""
    from mlx_specstream.json_grammar import MAX_ALTS

    node = {"anyOf": [{"type": "object", "additionalProperties": False, "properties": {
        "children": {"type": "array", "items": {"$ref": "#/$defs/N"}}, name: {"type": "string"}}}
        for name in ("a", "b")]}
    c = json_constraint(tok, {"$defs": {"N": node}, "$ref": "#/$defs/N"})
    state = c.walk(c.start, tok.encode('{"children": [' * 20, add_special_tokens=False))
    assert state[0] == "alt" and len(state[1]) <= MAX_ALTS and c.mask(state).any()
    assert reads(c, tok, '{"children": [{"children": [{"a": "x"}], "b": "y"}]}')
    nested = {"type": "string"}
    for _ in range(30):
        nested = {"type": "object", "properties": {"x": nested},
                  "anyOf": [{"required": ["x"]}, {"required": []}]}
    assert reads(json_constraint(tok, nested), tok, '{"x": {}}')


def test_what_is_not_enforced_is_said(tok):
    """Keywords read without being enforced are listed (``unread``), so a strict
    ``response_format`` is refused; the rest of these schemas still holds."""
    integer = {"$defs": {"A": {"type": "integer"}}, "$ref": "#/$defs/A"}
    for schema, said in [
            ({**integer, "type": "string"}, "type beside $ref"), ({"$ref": "b.json#/A"}, "$ref 'b.json#/A'"),
            ({"$defs": {"i": {"$anchor": "item"}}, "$ref": "#item"}, "$ref '#item'"),  # an anchor
            ({"items": [{"type": "string"}]}, "items as a list"), ({"maxLength": 3}, "maxLength without"),
            ({"enum": [[1.5], float("inf")]}, "enum or const of values JSON cannot write"),
            ({"properties": {"a": {}}, "required": ["b"]}, "required 'b' (not in properties)"),
            ({"type": "number", "multipleOf": 2}, "multipleOf")]:
        assert any(u.startswith(said) for u in json_constraint(tok, schema).unread), (schema, said)
    assert not json_constraint(tok, {"anyOf": [{"type": "string"}, {"type": "null"}], "maxLength": 3}).unread
    nullable = json_constraint(tok, {**integer, "nullable": True})
    assert reads(nullable, tok, "null") and reads(nullable, tok, "3") and not reads(nullable, tok, '"3"')
    for none_named in ({"type": "object", "additionalProperties": False},
                       {"type": "object", "properties": {}}):  # OpenAI's function without arguments
        closed = json_constraint(tok, none_named)
        assert reads(closed, tok, "{}") and not reads(closed, tok, '{"x": 1}')
    for any_keys in ({"type": "object"}, {"type": "object", "properties": {}, "additionalProperties": True},
                     {"type": "object", "properties": {}, "additionalProperties": {}}):
        assert reads(json_constraint(tok, any_keys), tok, '{"x": 1}')  # (Pydantic's extra="allow")


def test_keywords_meet_as_json_schema_says(tok):
    """Found by a second review: ``oneOf``/``allOf`` beside ``properties`` add their ``required``
    (they once replaced it); 20 consts in an ``anyOf`` stay writable (one choice); ``$`` ends the
    text as ECMA-262's (not before a line break); a pattern with ``maxLength`` never leaves no room
    to end (the length is listed as not enforced)."""
    kinds = {"type": "object", "additionalProperties": False, "required": ["kind"],
             "properties": {"kind": {"type": "string"}, "a": {}, "b": {}},
             "oneOf": [{"required": ["a"]}, {"required": ["b"]}]}
    c = json_constraint(tok, kinds)
    assert reads(c, tok, '{"kind": "x", "a": 1}') and not reads(c, tok, '{"a": 1}')
    assert not reads(c, tok, '{"kind": "x"}')
    both = json_constraint(tok, {"properties": {"a": {}}, "required": ["a"],
                                 "allOf": [{"required": ["b"], "properties": {"b": {}}}]})
    assert reads(both, tok, '{"a": 1, "b": 2}') and not reads(both, tok, '{"b": 2}')
    many = json_constraint(tok, {"anyOf": [{"const": f"v{i}"} for i in range(20)]})
    assert all(reads(many, tok, f'"v{i}"') for i in range(20))
    ended = json_constraint(tok, {"type": "string", "pattern": "^[a-z]+$"})
    assert reads(ended, tok, '"abc"') and not reads(ended, tok, '"abc\\n"')
    slug = {"type": "string", "pattern": "^[a-z]+(-[a-z]+)*$", "maxLength": 10}
    c = json_constraint(tok, slug)
    assert c.unread == {"maxLength beside a pattern or format"}
    assert c.mask(c.walk(c.start, tok.encode('"abcdefghi-', add_special_tokens=False))).any()


def test_pydantic_models_read_back(tok):
    """A Pydantic model's own schema (``model_json_schema``, as the ``openai`` client sends it): texts
    drawn under the constraint are instances of the model (Pydantic is the oracle)."""
    pydantic = pytest.importorskip("pydantic")
    import datetime
    import uuid
    from typing import Literal

    class Item(pydantic.BaseModel):
        name: str = pydantic.Field(max_length=12)
        qty: int = pydantic.Field(ge=1, lt=100)
        share: float = pydantic.Field(gt=0, le=1)
        tags: list[Literal["new", "used"]] = []
        code: str = pydantic.Field(pattern=r"^[A-Z]{3}-[0-9]{2}$")
        ref: uuid.UUID
        when: datetime.date

    class Order(pydantic.BaseModel):
        items: list[Item]
        note: str | None = None
        prices: dict[str, float]
        parent: Order | None = None

    c = json_constraint(tok, Order.model_json_schema())
    finished = 0
    for ids, ended in drawn_texts(c, tok, max_tokens=400):
        if ended:
            finished += 1
            Order.model_validate_json(tok.decode(ids))
    assert finished >= 8
    item = {"name": "a", "qty": 1, "share": 0.5, "code": "ABC-12", "ref": UUID, "when": "2024-02-29"}
    assert reads(c, tok, json.dumps({"items": [item], "prices": {}}))
    for wrong in ({"qty": "1"}, {"qty": 0}, {"qty": 100}, {"share": 0}, {"share": 1.5}, {"name": "a" * 13},
                  {"code": "AB-12"}, {"when": "2023-02-29"}):
        assert not reads(c, tok, json.dumps({"items": [item | wrong], "prices": {}})), wrong


def test_texts_drawn_through_the_constraint_are_valid(tok):
    """The other way: texts drawn at random under the constraint (biased to end) parse, and
    ``jsonschema`` accepts them; the masks for sampling equal the constraint's token-by-token
    answer (:meth:`TokenConstraint.allowed`) on the way."""
    # (SCHEMA2 without its recursion at the top, or random drafts rarely end)
    flat = {**SCHEMA2, "properties": {k: v for k, v in SCHEMA2["properties"].items() if k != "root"}}
    for schema in (SCHEMA, flat):
        c = json_constraint(tok, schema)
        finished = 0
        for ids, ended in drawn_texts(c, tok, max_tokens=400):
            if ended:
                finished += 1
                jsonschema.validate(json.loads(tok.decode(ids)), schema)
        assert finished >= 8


def test_an_object_holds_each_key_once(tok):
    """In an object of any keys (OpenAI's ``json_object``) and in a map (``dict[str, X]``) a key
    comes once, however it is escaped (a parser keeps only its last value); each object has its
    own keys. The oracle: ``json``'s pairs of each object, on texts drawn under the constraint,
    whose masks equal its token-by-token answer (also inside keys, read from the keyless state's)."""
    def once(pairs):
        keys = [k for k, _ in pairs]
        assert len(keys) == len(set(keys)), keys
        return dict(pairs)

    for schema in (None, {"type": "object", "additionalProperties": {"type": "integer"}}):
        c = json_constraint(tok, schema)
        assert reads(c, tok, '{"a": 1, "A": 2, "ab": 3}')
        for text in ('{"a": 1, "b": 2, "a": 3}', '{"a": 1, "\\u0061": 2}', '{"": 1, "": 2}'):
            assert not reads(c, tok, text), (schema, text)
        opened = c.walk(c.start, tok.encode('{"ab": 1, "a', add_special_tokens=False))
        assert c.walk(opened, tok.encode('b": 2}', add_special_tokens=False)) is None
        assert c.walk(opened, tok.encode('c": 2}', add_special_tokens=False)) is not None
        finished = 0
        for ids, ended in drawn_texts(c, tok, n=20, max_tokens=200):
            if ended:
                finished += 1
                json.loads(tok.decode(ids), object_pairs_hook=once)
        assert finished >= 10
    assert reads(json_constraint(tok), tok, '{"a": {"a": 1}, "b": [{"a": 2}, {"a": 3}], "c": {"b": 1}}')


SQL = "CREATE TABLE head (age INTEGER, name VARCHAR)\n-- How many heads are older than 56 ?\n"
QUERY = {"type": "object", "additionalProperties": False, "required": ["kind", "n", "ok"], "properties": {
    "kind": {"enum": ["select", "insert"]}, "n": {"type": "integer"}, "ok": {"type": "boolean"}}}


CHAT = ("{% for m in messages %}### {{ m['role'] }}:\n{{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}### assistant:\n{% endif %}")


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory):
    """The shipped model and adapters (linked) with a chat template, for the chat endpoint."""
    return templated_model(tmp_path_factory.mktemp("chat") / "specstream-tiny", DEFAULT_MODEL, CHAT)


@pytest.fixture(scope="module")
def server(chat_model):
    pytest.importorskip("openai")
    s = Server("--model", str(chat_model), "--adapters", "sql-lossless")
    yield s
    assert s.stop() == 0


def test_response_format_through_the_server(server, tok):
    """``response_format`` (json_schema, json_object) on the shipped model with its lossless
    adapter: the text plain decoding of the base writes under the same constraint, JSON the schema
    allows; malformed or conflicting requests are a 400 on the field."""
    base, _ = load(DEFAULT_MODEL)
    client = server.client()
    for fmt, schema in [({"type": "json_schema", "json_schema": {"name": "q", "schema": QUERY}}, QUERY),
                        ({"type": "json_object"}, None)]:
        want = generate(base, tok, SQL, max_tokens=90, mode="ar", constraint=response_constraint(tok, fmt))
        r = client.completions.create(model="specstream-tiny:sql-lossless", prompt=SQL, max_tokens=90,
                                      extra_body={"response_format": fmt})
        assert (r.choices[0].text, r.choices[0].finish_reason) == (want.text, want.finish_reason)
        assert r.model_extra["speculative"]["mean_accepted_tokens"] > 1
        if schema:  # this one the model finishes (any object, it does not: it repeats a key until cut)
            assert want.finish_reason == "stop"
            jsonschema.validate(json.loads(want.text), schema)
    body = {"model": "specstream-tiny", "prompt": SQL, "max_tokens": 4}
    for extra, param in [({"response_format": {"type": "json_schema"}}, "response_format"),
                         ({"response_format": {"type": "xml"}}, "response_format"),
                         ({"response_format": {"type": "json_schema", "json_schema": {
                             "name": "q", "schema": {"type": "text"}}}}, "response_format"),
                         ({"response_format": {"type": "json_schema", "json_schema": {"name": "q", "schema": {
                             "type": "integer", "minimum": 5, "maximum": 3}}}}, "response_format"),
                         ({"response_format": {"type": "json_object"}, "sql_names": True}, "sql_names")]:
        status, reply = server.post_raw("/v1/completions", json.dumps({**body, **extra}).encode())
        assert (status, reply["error"]["param"]) == (400, param), reply
    assert server.get("/health")["status"] == "ok"


def test_the_openai_clients_parse_helper(server, chat_model):
    """The ``openai`` client's ``chat.completions.parse`` with a Pydantic model (the schema it sends,
    strict, with ``anyOf`` for an optional field): the reply is the model's instance, and the text
    plain decoding writes under the schema's constraint."""
    pydantic = pytest.importorskip("pydantic")
    from typing import Literal

    class Query(pydantic.BaseModel):
        kind: Literal["select", "insert"]
        n: int
        note: str | None

    base, tok = load(chat_model)
    messages = [{"role": "user", "content": SQL}]
    r = server.client().chat.completions.parse(model="specstream-tiny:sql-lossless", messages=messages,
                                               response_format=Query, max_tokens=90)
    parsed = r.choices[0].message.parsed
    assert isinstance(parsed, Query) and r.choices[0].finish_reason == "stop"
    want = generate(base, tok, tok.apply_chat_template(messages), max_tokens=90, mode="ar",
                    constraint=json_constraint(tok, Query.model_json_schema()))
    assert r.choices[0].message.content == want.text


def test_generate_json_schema(tok, tmp_path):
    """``generate --json-schema FILE`` writes what the API writes under ``json_constraint``; a bad
    file, or a schema with another constraint, is one line."""
    model, _ = load(DEFAULT_MODEL, adapter="sql-lossless")
    want = generate(model, tok, SQL, max_tokens=60, constraint=json_constraint(tok, QUERY)).text
    (tmp_path / "q.json").write_text(json.dumps(QUERY))
    (tmp_path / "list.json").write_text("[1]")
    run = [sys.executable, "-m", "mlx_specstream.cli", "generate", "--adapter", "sql-lossless", "-p", SQL,
           "--max-tokens", "60"]
    res = subprocess.run([*run, "--json-schema", str(tmp_path / "q.json")], capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0 and res.stdout == want + "\n", res.stderr
    for extra, said in [(["--json-schema", "q.json", "--sql-names"], "--json-schema cannot be combined with "
                                                                     "--sql-names"),
                        (["--json-schema", "list.json"], "list.json: a JSON schema is an object"),
                        (["--json-schema", "none.json"], "cannot read the schema file")]:
        res = subprocess.run([*run, *extra], capture_output=True, text=True, timeout=300, cwd=tmp_path)
        lines = res.stderr.strip().splitlines()
        assert res.returncode != 0 and len(lines) == 1 and said in lines[0], res.stderr
