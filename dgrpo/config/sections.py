"""The base of every configuration section: strict, frozen, validated defaults.

Every section forbids unknown keys; :func:`dgrpo.overrides.explain_validation_error` turns pydantic's error into
one that lists the valid keys. Configuration imports neither torch nor transformers (a test checks it), so
reading, validating and printing a configuration is instant.
"""

from __future__ import annotations

import functools
import types
from typing import Any, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, model_validator

_SEQUENCES = (list, tuple, set, frozenset)


def fill_section(data: Any, key: str, default: BaseModel) -> Any:
    """Before validation: a partial ``key`` section (e.g. only ``sampling.max_new_tokens`` overridden) keeps
    the field's default values for the keys it leaves out, not the model class's defaults."""
    if isinstance(data, dict) and isinstance(data.get(key), dict):
        return {**data, key: {**default.model_dump(), **data[key]}}
    return data


def is_list_annotation(annotation: Any) -> bool:
    """Whether a field of this type holds a list (``list[str]``, ``list[str] | None``, a tuple or a set) and
    text is not itself a valid value of it."""
    if get_origin(annotation) in (Union, types.UnionType):
        members = get_args(annotation)
        return str not in members and any(is_list_annotation(m) for m in members)
    return annotation in _SEQUENCES or get_origin(annotation) in _SEQUENCES


@functools.cache
def list_fields(model: type[BaseModel]) -> frozenset[str]:
    """The names of ``model``'s list-valued fields (:func:`is_list_annotation`)."""
    return frozenset(name for name, field in model.model_fields.items() if is_list_annotation(field.annotation))


def split_list_text(text: str) -> list[str]:
    """``logit`` -> ``["logit"]``, ``logit, length`` -> ``["logit", "length"]``, empty text -> ``[]``."""
    return [item.strip() for item in text.split(",") if item.strip()]


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)

    @model_validator(mode="before")
    @classmethod
    def _list_from_text(cls, data: Any) -> Any:
        """A list-valued key given as text is its comma-separated items: ``-s defense.chain=logit,length`` (and
        ``chain = "logit"`` in a TOML file) as well as ``-s 'defense.chain=["logit","length"]'``."""
        if not isinstance(data, dict):
            return data
        texts = {key: data[key] for key in list_fields(cls) if isinstance(data.get(key), str)}
        return {**data, **{key: split_list_text(text) for key, text in texts.items()}} if texts else data
