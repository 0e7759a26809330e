"""The base of every wire model: strict, frozen, every field required, floats only as floats."""

from __future__ import annotations

from typing import Any, ClassVar

import msgpack
from pydantic import model_validator

from dgrpo.protocol.messages import StrictModel


class WireModel(StrictModel):
    """A strict model whose fields are all required and whose float fields accept only floats.

    pydantic's strict mode still accepts an int for a float field; on the wire that would be a msgpack int
    where the spec says float 64, a second encoding of the same value, so it is rejected here. Defaults (as
    :class:`~dgrpo.protocol.messages.SamplingParams` has) are for code, not for the wire: a message lists
    every field, except those a model names in ``wire_optional`` (fields added to the protocol later, left out
    of the encoding when empty so that older messages stay valid byte for byte).
    """

    wire_optional: ClassVar[frozenset[str]] = frozenset()

    @model_validator(mode="before")
    @classmethod
    def _complete_and_floats_are_floats(cls, data: Any) -> Any:
        if isinstance(data, dict):
            missing = [name for name in cls.model_fields if name not in data and name not in cls.wire_optional]
            if missing:
                raise ValueError(f"missing field(s) {', '.join(missing)}")
            for name, info in cls.model_fields.items():
                if info.annotation is float and name in data and type(data[name]) is not float:
                    raise ValueError(f"{name} must be a float (msgpack float 64), got {type(data[name]).__name__}")
                floats = info.annotation == tuple[float, ...] and isinstance(data.get(name), tuple | list)
                if floats and any(type(v) is not float for v in data[name]):
                    raise ValueError(f"{name} must hold floats (msgpack float 64)")
        return data


def _pairs_to_dict(pairs: list[tuple[Any, Any]]) -> dict[Any, Any]:
    # msgpack allows duplicate map keys and decoders disagree on which wins; refuse them instead.
    out = dict(pairs)
    if len(out) != len(pairs):
        raise ValueError("duplicate map key")
    return out


def strict_unpack(data: bytes, max_bytes: int, max_array_len: int, max_map_len: int) -> Any:
    """msgpack as every dgrpo message is read: str is valid UTF-8, bin is bytes, arrays are tuples (which strict
    pydantic accepts for tuple fields), map keys are str or bytes and never repeat, no ext types, and no
    declared length beyond the given bounds. Raises whatever msgpack raises; callers turn it into a verdict."""
    return msgpack.unpackb(
        data,
        raw=False,
        use_list=False,
        strict_map_key=True,
        object_pairs_hook=_pairs_to_dict,
        max_bin_len=max_bytes,
        max_str_len=max_bytes,
        max_array_len=max_array_len,
        max_map_len=max_map_len,
        max_ext_len=0,
    )
