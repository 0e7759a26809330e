"""The base of every configuration section: strict, frozen, validated defaults.

Every section forbids unknown keys; :func:`dgrpo.overrides.explain_validation_error` turns pydantic's error into
one that lists the valid keys. Configuration imports neither torch nor transformers (a test checks it), so
reading, validating and printing a configuration is instant.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict


def fill_section(data: Any, key: str, default: BaseModel) -> Any:
    """Before validation: a partial ``key`` section (e.g. only ``sampling.max_new_tokens`` overridden) keeps
    the field's default values for the keys it leaves out, not the model class's defaults."""
    if isinstance(data, dict) and isinstance(data.get(key), dict):
        return {**data, key: {**default.model_dump(), **data[key]}}
    return data


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)
