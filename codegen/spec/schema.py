"""Stage 2: the JSON Schema check, with each error at its YAML node.

schema/kspec.schema.json is the one source of truth for the format; this module
only runs it and turns jsonschema's errors into located diagnostics.
"""

from __future__ import annotations

import functools
import json
import re
from importlib import resources
from pathlib import Path
from typing import Iterable

from kspec.codegen.diagnostics import Diagnostic, SpecError, did_you_mean
from kspec.codegen.spec.loader import Document

SCHEMA_PATH = Path(str(resources.files("kspec") / "schema" / "kspec.schema.json"))
# A hostile file can hold thousands of errors (one per unknown key); the first
# hundred say enough, and stopping there keeps the check fast.
MAX_DIAGNOSTICS = 100
_SIZE_LIMITS = {
    "maxItems": ("at most", "items"),
    "minItems": ("at least", "items"),
    "maxProperties": ("at most", "entries"),
    "minProperties": ("at least", "entries"),
    "maxLength": ("at most", "characters"),
    "minLength": ("at least", "characters"),
}


@functools.lru_cache(maxsize=1)
def schema() -> dict:
    return json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))


def _ecma(pattern: str) -> str:
    """A schema `pattern` with ECMA-262's meaning of a final `$`: the end of the text.
    Python's `$` also matches before a final newline, so `"x\\n"` would pass `^[a-z]+$`."""
    if pattern.endswith("$") and not pattern.endswith("\\$"):
        return pattern[:-1] + "\\Z"
    return pattern


def _pattern(validator, pattern, instance, schema):
    if validator.is_type(instance, "string") and not re.search(_ecma(pattern), instance):
        import jsonschema

        yield jsonschema.ValidationError(f"{instance!r} does not match {pattern!r}")


@functools.lru_cache(maxsize=1)
def _validator():
    import jsonschema

    ecma = jsonschema.validators.extend(jsonschema.Draft202012Validator, {"pattern": _pattern})
    return ecma(schema())


def _shown(path) -> str:
    return ".".join(str(p) for p in path) or "the spec"


def _resolve(subschema: dict) -> dict:
    ref = subschema.get("$ref")
    if ref and ref.startswith("#/$defs/"):
        return schema()["$defs"][ref[len("#/$defs/") :]]
    return subschema


def _diagnostics(error, doc: Document) -> Iterable[Diagnostic]:
    path = tuple(error.absolute_path)
    where = _shown(path)
    kind = error.validator
    sub = _resolve(error.schema) if isinstance(error.schema, dict) else {}
    if kind == "additionalProperties" and isinstance(error.instance, dict):
        allowed = set(error.schema.get("properties", {}))
        extra = [k for k in error.instance if k not in allowed]
        pattern = error.schema.get("patternProperties")
        if pattern:  # a case: extra keys are dims and already matched the pattern
            extra = [k for k in extra if not any(re.match(p, k) for p in pattern)]
        scope = f"in {where}" if path else "at the top level"
        backends = path == ("backends",)  # the schema's backend keys are the backends table
        return (  # lazily: validate() stops after MAX_DIAGNOSTICS
            Diagnostic(
                "E409" if backends else "E201",
                f"unknown backend `{key}`" if backends else f"unknown key `{key}` {scope}",
                doc.key_loc(path + (key,)),
                did_you_mean(key, allowed)
                or f"{'backends' if backends else 'allowed keys'}: {', '.join(sorted(allowed))}",
            )
            for key in extra
        )
    if kind == "required":
        missing = error.message.split("'")[1] if "'" in error.message else error.message
        return [Diagnostic("E202", f"{where} is missing required key `{missing}`", doc.loc(path))]
    if kind in ("anyOf", "oneOf"):
        expect = sub.get("x-expect") or error.schema.get("x-expect") or "a valid value"
        return [Diagnostic("E203", f"{where} must be {expect}", doc.loc(path))]
    if kind == "type":
        want = error.validator_value
        want = " or ".join(want) if isinstance(want, list) else want
        return [
            Diagnostic(
                "E203",
                f"{where} must be of type {want}, not {_type_name(error.instance)}",
                doc.loc(path),
            )
        ]
    if kind in ("enum", "const"):
        options = error.validator_value if kind == "enum" else [error.validator_value]
        hint = did_you_mean(str(error.instance), [str(o) for o in options])
        shown = ", ".join(json.dumps(o) for o in options)
        return [Diagnostic("E200", f"{where} must be one of {shown}", doc.loc(path), hint)]
    if kind == "pattern" and "x-expect" in error.schema:
        return [Diagnostic("E200", f"{where} must be {error.schema['x-expect']}", doc.loc(path))]
    if kind == "pattern":
        return [
            Diagnostic(
                "E200",
                f"{where}: {json.dumps(error.instance)[:80]} is not a valid name",
                doc.loc(path),
                "names are Python identifiers: letters, digits and _",
            )
        ]
    if kind == "propertyNames":
        return [
            Diagnostic(
                "E200",
                f"{where}: key {json.dumps(error.instance)[:80]} is not a valid name",
                doc.key_loc(path + (error.instance,)) if isinstance(error.instance, str) else doc.loc(path),
                "names are Python identifiers: letters, digits and _",
            )
        ]
    if kind in _SIZE_LIMITS and isinstance(error.instance, (str, list, dict)):
        bound, unit = _SIZE_LIMITS[kind]
        return [
            Diagnostic(
                "E200",
                f"{where} has {len(error.instance)} {unit}; {bound} {error.validator_value} allowed",
                doc.loc(path),
            )
        ]
    message = error.message if len(error.message) < 200 else error.message[:200] + "..."
    return [Diagnostic("E200", f"{where}: {message}", doc.loc(path))]


def _type_name(value) -> str:
    return {
        dict: "mapping",
        list: "list",
        str: "string",
        bool: "boolean",
        int: "integer",
        float: "number",
        type(None): "null",
    }.get(type(value), type(value).__name__)


def validate(doc: Document) -> None:
    """Raise SpecError listing every schema violation in the document."""
    found: list[Diagnostic] = []
    seen = set()
    for error in _validator().iter_errors(doc.data):
        if error.validator == "propertyNames" and error.context:
            # report the offending key itself
            error.instance = error.context[0].instance
        for diag in _diagnostics(error, doc):
            key = (diag.loc, diag.code, diag.message)
            if key not in seen:
                seen.add(key)
                found.append(diag)
            if len(found) == MAX_DIAGNOSTICS:
                raise SpecError(found)
    if found:
        raise SpecError(found)
