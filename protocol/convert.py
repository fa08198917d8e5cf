"""The wire converter: camelCase names, strict JSON types, readable errors.

camelCase for every attrs class, with primitives made strict — cattrs would otherwise turn
`"5"` into `5` — so params of the wrong type are rejected with a message that names the field.
"""

from __future__ import annotations

import re
from typing import Any, TypeVar, get_args

import attrs
import cattrs
import cattrs.gen

from .types import Json

T = TypeVar("T")


class ParamsError(ValueError):
    """Params that do not fit their type; the message names every offending field, and
    `fields` lists their paths as the client wrote them (`params.sessionId`)."""

    def __init__(self, message: str, fields: list[str] | None = None) -> None:
        super().__init__(message)
        self.fields = list(fields or [])


def _strict(kind: type, name: str, exclude_bool: bool = False) -> Any:
    def hook(value: Any, _type: Any) -> Any:
        if not isinstance(value, kind) or (exclude_bool and isinstance(value, bool)):
            raise ValueError(f"expected {name}, got {_json_type(value)}")
        return value

    return hook


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def _object(value: Any, _type: Any) -> Any:
    if not isinstance(value, dict):
        raise ValueError(f"expected object, got {_json_type(value)}")
    return value


def _objects(value: Any, _type: Any) -> Any:
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise ValueError(f"expected array of objects, got {_json_type(value)}")
    return value


def _text_or_blocks(value: Any, _type: Any) -> Any:
    if isinstance(value, str):
        return value
    return _objects(value, _type)


def _system(value: Any, _type: Any) -> Any:
    if value is None:
        return None
    return _text_or_blocks(value, _type)


def camel(name: str) -> str:
    """A field's wire name: `session_id` → `sessionId`."""
    head, *rest = name.rstrip("_").split("_")
    return head + "".join(p.title() for p in rest)


def _renames(cls: type) -> dict[str, Any]:
    return {
        a.name: cattrs.gen.override(rename=camel(a.name), omit_if_default=True)
        for a in attrs.fields(cls)
    }


def make_converter() -> cattrs.Converter:
    """camelCase on the wire for every attrs class (fields equal to their default are left
    out of answers, as LSP peers expect), strict JSON primitives, pass-through JSON objects.
    Plain cattrs: a client importing this does not pay for lsprotocol's ~1,000 LSP types."""
    conv = cattrs.Converter(forbid_extra_keys=False)
    conv.register_unstructure_hook_factory(
        attrs.has, lambda cls: cattrs.gen.make_dict_unstructure_fn(cls, conv, **_renames(cls))
    )
    conv.register_structure_hook_factory(
        attrs.has, lambda cls: cattrs.gen.make_dict_structure_fn(cls, conv, **_renames(cls))
    )
    conv.register_structure_hook(str, _strict(str, "string"))
    conv.register_structure_hook(int, _strict(int, "integer", exclude_bool=True))
    conv.register_structure_hook(bool, _strict(bool, "boolean"))
    conv.register_structure_hook(float, _strict(int | float, "number", exclude_bool=True))
    exact = {
        Json: _object,
        list[Json]: _objects,
        str | list[Json]: _text_or_blocks,
        str | list[Json] | None: _system,
        Any: lambda value, _type: value,
    }
    for tp, hook in exact.items():
        conv.register_structure_hook_func(lambda t, tp=tp: t == tp, hook)
        # JSON in, JSON out: never walk (and copy) a rendered request field by field
        conv.register_unstructure_hook_func(lambda t, tp=tp: t == tp, lambda value: value)
    return conv


CONVERTER = make_converter()


MAX_DEPTH = 128
"""How deeply params may nest. The daemon stores and answers with orjson, which refuses
values nested deeper than 255 levels: deeper params could be neither written to a session log
nor sent back, so they are rejected here, naming the field, before anything happens."""


def _too_deep(value: Any, limit: int) -> bool:
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


def structure(raw: Any, cls: type[T], method: str = "", *, check_depth: bool = True) -> T:
    """`raw` params as `cls`, or `ParamsError` naming each bad field (camelCase, as sent).
    `check_depth=False` for answers the daemon wrote itself (it could not write deeper)."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ParamsError(f"params of {method or cls.__name__} must be an object")
    name = method or cls.__name__
    for key, value in raw.items() if check_depth else ():
        if _too_deep(value, MAX_DEPTH - 1):
            raise ParamsError(
                f"invalid params for {name}: nested deeper than {MAX_DEPTH} levels @ params.{key}",
                [f"params.{key}"],
            )
    try:
        return CONVERTER.structure(raw, cls)
    except cattrs.BaseValidationError as exc:
        problems = [_explain(p) for p in cattrs.transform_error(exc, path="params")]
        raise ParamsError(
            f"invalid params for {name}: " + "; ".join(t for t, _ in problems),
            [path for _, path in problems if path],
        ) from None
    except (TypeError, ValueError) as exc:
        raise ParamsError(f"invalid params for {name}: {exc}") from None


_JSON_NAMES = {
    "str": "a string",
    "int": "an integer",
    "bool": "a boolean",
    "float": "a number",
    "None": "null",
    "NoneType": "null",
    "dict[str, typing.Any]": "an object",
    "list[dict[str, typing.Any]]": "an array of objects",
    "list[str]": "an array of strings",
    "typing.Any": "any value",
}


def _explain(problem: str) -> tuple[str, str | None]:
    """A cattrs problem in the client's words: JSON type names, and the field path as the
    client wrote it (`params.sessionId`, not `params.session_id`)."""
    text, sep, path = problem.rpartition(" @ ")
    if not sep:
        return problem, None
    path = re.sub(r"_([a-z])", lambda m: m.group(1).upper(), path)
    expected = re.search(r"expected (.+)$", text)
    if expected:
        names = [_JSON_NAMES.get(t.strip(), t.strip()) for t in expected.group(1).split(" | ")]
        text = "expected " + " or ".join(names)
    literal = re.search(r"\((.+) not in literal typing\.Literal\[(.+)\]\)", text)
    if literal:
        text = f"{literal.group(1)!r} is not one of {literal.group(2)}"
    return f"{text} @ {path}", path


def unstructure(obj: Any) -> Any:
    return CONVERTER.unstructure(obj)


def literal_values(tp: Any) -> tuple[Any, ...]:
    return get_args(tp)
