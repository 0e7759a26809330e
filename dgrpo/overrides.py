"""``key.sub=value`` overrides for TOML-shaped configuration, and readable configuration errors."""

from __future__ import annotations

import json
import tomllib
import types
from typing import Any, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo

from dgrpo.errors import ConfigError


def parse_value(text: str) -> Any:
    """A TOML literal (``1e-4``, ``true``, ``'x'``, ``[1, 2]``), else JSON, else the text itself."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            return text


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``a.b.c=value`` overrides to nested dicts in place (and return them)."""
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"override {item!r} is not of the form key=value (e.g. learner.lr=1e-4)")
        node = data
        parts = key.strip().split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {item!r}: {part!r} is not a section")
        node[parts[-1]] = parse_value(value.strip())
    return data


def _submodel(annotation: Any) -> type[BaseModel] | None:
    """The section type of a field (``X``, ``X | None``), None where it holds no section."""
    if get_origin(annotation) in (Union, types.UnionType):
        models = [m for m in get_args(annotation) if isinstance(m, type) and issubclass(m, BaseModel)]
        return models[0] if len(models) == 1 else None
    return annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None


def field_at(model: type[BaseModel], path: tuple[str | int, ...]) -> FieldInfo | None:
    """The field at ``path`` (sections walked into), None where there is none; a list item's path ends in its
    index, which is skipped (the list's field is returned)."""
    current: type[BaseModel] | None = model
    found: FieldInfo | None = None
    for part in path:
        if isinstance(part, int):
            return found
        found = current.model_fields.get(part) if current is not None else None
        if found is None:
            return None
        current = _submodel(found.annotation)
    return found


# The kinds of value a type error can want, by pydantic's error type.
_KINDS = {
    **dict.fromkeys(("list_type", "tuple_type", "set_type", "frozen_set_type", "iterable_type"), "list"),
    **dict.fromkeys(("bool_type", "bool_parsing"), "bool"),
    **dict.fromkeys(("int_type", "int_parsing", "int_from_float", "int_parsing_size"), "int"),
    **dict.fromkeys(("float_type", "float_parsing", "finite_number"), "float"),
    "string_type": "str",
}
# Example items where the field's default is empty and placeholder names would say less.
LIST_EXAMPLES: dict[str, tuple[str, ...]] = {"defense.chain": ("logit", "length"), "defense.foreign": ("length",)}


def syntax_hint(key: str, kind: str, field: FieldInfo, given: Any, flag: str = "-s ") -> str:
    """What a ``kind`` value looks like on the command line, with an example for ``key`` (its default where it
    has one): ``expected a list, e.g. -s defense.chain=logit,length or -s 'defense.chain=["logit","length"]'``."""
    default = field.get_default(call_default_factory=True)
    quote = "'" if flag else ""
    if kind == "list":
        items = LIST_EXAMPLES.get(key) or (
            tuple(str(d) for d in default) if isinstance(default, list | tuple) and default else ("a", "b")
        )
        listed = json.dumps(list(items), separators=(",", ":"))
        return f"expected a list, e.g. {flag}{key}={','.join(items)} or {flag}{quote}{key}={listed}{quote}"
    if kind == "bool":
        return f"expected true or false, e.g. {flag}{key}=true"
    number = default if isinstance(default, int | float) and not isinstance(default, bool) else None
    if kind == "int":
        return f"expected a whole number, e.g. {flag}{key}={number if isinstance(number, int) else 1}"
    if kind == "float":
        return f"expected a number, e.g. {flag}{key}={0.5 if number is None else number}"
    text = json.dumps(str(given) if isinstance(given, int | float | bool) else str(default or "text"))
    return f"expected text (quoted where it reads as a number or boolean), e.g. {flag}{quote}{key}={text}{quote}"


def section_keys(model: type[BaseModel], path: tuple[str | int, ...]) -> list[str]:
    """The valid keys of the section at ``path`` (its last element is the offending key)."""
    current: type[BaseModel] = model
    for part in path[:-1]:
        field = current.model_fields.get(str(part))
        annotation = getattr(field, "annotation", None)
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return []
        current = annotation
    return sorted(current.model_fields)


def explain_validation_error(exc: ValidationError, model: type[BaseModel], what: str) -> ConfigError:
    """One ConfigError for all problems; an unknown key lists the valid keys of its section."""
    messages = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"])
        if err["type"] == "extra_forbidden":
            valid = section_keys(model, tuple(err["loc"]))
            messages.append(f"unknown {what} key {loc!r}; valid keys here: {', '.join(valid)}")
        else:
            # pydantic prefixes a validator's own message with "Value error, ", which says nothing to a user
            message = f"{loc}: {err['msg'].removeprefix('Value error, ')}"
            path = tuple(err["loc"])
            field = field_at(model, path)
            kind = _KINDS.get(err["type"])
            if kind is not None and field is not None:
                item = any(isinstance(p, int) for p in path)  # an item of a list: show the list's syntax
                key = ".".join(str(p) for p in path if not isinstance(p, int))
                # A plug-in's options are keys below defense.options.NAME (or adversary.options): no -s example
                flag = "" if what.endswith(" option") else "-s "
                message += "; " + syntax_hint(key, "list" if item else kind, field, err.get("input"), flag)
            messages.append(message)
    return ConfigError(f"invalid {what}: " + "; ".join(messages))
