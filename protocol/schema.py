"""A JSON Schema for every method's params and result, every notification and the error codes.

Generated from the attrs wire types in `types.py` (the same ones the daemon structures params
with), exported by `compactd schema`, and checked in as `schema.json`; a test fails when the
two disagree. Non-Python clients generate their types from it. Optional fields may be omitted
on the wire; an omitted field means its default.
"""

from __future__ import annotations

import json
import types
import typing
from importlib import resources
from typing import Any, Literal, Union, get_args, get_origin

import attrs

from . import errors
from .convert import camel
from .types import METHODS, NOTIFICATIONS, SERVER_REQUESTS

SCHEMA_VERSION = 1
DIALECT = "https://json-schema.org/draft/2020-12/schema"


class _Builder:
    def __init__(self) -> None:
        self.defs: dict[str, Any] = {}

    def type_schema(self, tp: Any) -> dict[str, Any]:
        if tp is Any:
            return {}
        if tp is type(None):
            return {"type": "null"}
        if tp is str:
            return {"type": "string"}
        if tp is bool:
            return {"type": "boolean"}
        if tp is int:
            return {"type": "integer"}
        if tp is float:
            return {"type": "number"}
        if tp is dict:
            return {"type": "object"}
        origin = get_origin(tp)
        if origin is Literal:
            return {"enum": list(get_args(tp))}
        if origin in (Union, types.UnionType):
            options = [self.type_schema(a) for a in get_args(tp)]
            return {"anyOf": options}
        if origin is list:
            (item,) = get_args(tp) or (Any,)
            return {"type": "array", "items": self.type_schema(item)}
        if origin is dict:
            _key, value = get_args(tp) or (str, Any)
            out: dict[str, Any] = {"type": "object"}
            if value is not Any:
                out["additionalProperties"] = self.type_schema(value)
            return out
        if attrs.has(tp):
            self.define(tp)
            return {"$ref": f"#/$defs/{tp.__name__}"}
        raise TypeError(f"no JSON Schema for {tp!r}")

    def define(self, cls: type) -> None:
        name = cls.__name__
        if name in self.defs:
            return
        self.defs[name] = {}  # placeholder against recursion
        hints = typing.get_type_hints(cls)
        props: dict[str, Any] = {}
        required: list[str] = []
        for field in attrs.fields(cls):
            schema = self.type_schema(hints[field.name])
            if field.default is not attrs.NOTHING:
                default = field.default
                if not isinstance(default, attrs.Factory):  # type: ignore[arg-type]
                    schema = {**schema, "default": default}
            else:
                required.append(camel(field.name))
            props[camel(field.name)] = schema
        out: dict[str, Any] = {"type": "object", "properties": props}
        if required:
            out["required"] = required
        doc = (cls.__doc__ or "").strip()
        if doc:
            out["description"] = " ".join(doc.split())
        self.defs[name] = out


def build_schema() -> dict[str, Any]:
    builder = _Builder()
    methods = {
        name: {"params": builder.type_schema(params), "result": builder.type_schema(result)}
        for name, (params, result) in METHODS.items()
    }
    notifications = {name: {"params": builder.type_schema(p)} for name, p in NOTIFICATIONS.items()}
    server_requests = {
        name: {"params": builder.type_schema(p), "result": builder.type_schema(r)}
        for name, (p, r) in SERVER_REQUESTS.items()
    }
    return {
        "$schema": DIALECT,
        "$id": "https://compactd.dev/schema/rpc.json",
        "title": "compactd JSON-RPC surface",
        "version": SCHEMA_VERSION,
        "methods": methods,
        "notifications": notifications,
        "serverRequests": server_requests,
        "errors": {
            kind: {"code": code, "description": text}
            for kind, (code, text) in errors.ERRORS.items()
        },
        "$defs": dict(sorted(builder.defs.items())),
    }


def schema_text() -> str:
    return json.dumps(build_schema(), indent=2, sort_keys=False) + "\n"


def checked_in_schema() -> str:
    return resources.files("compactd.protocol").joinpath("schema.json").read_text("utf-8")
