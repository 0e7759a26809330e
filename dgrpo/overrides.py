"""``key.sub=value`` overrides for TOML-shaped configuration, and readable configuration errors."""

from __future__ import annotations

import json
import tomllib
from typing import Any

from pydantic import BaseModel, ValidationError

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
            messages.append(f"{loc}: {err['msg'].removeprefix('Value error, ')}")
    return ConfigError(f"invalid {what}: " + "; ".join(messages))
