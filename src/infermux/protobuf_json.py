"""Protobuf messages rendered as Triton renders them in JSON (the ``/config`` endpoint, a Python
model's ``model_config``): field names as in the ``.proto``, every field present, and 64-bit
integers as numbers, where protobuf's JSON mapping writes strings."""

from __future__ import annotations

from typing import Any

from google.protobuf import json_format
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

_INT64_TYPES = frozenset(
    {
        FieldDescriptor.TYPE_INT64,
        FieldDescriptor.TYPE_UINT64,
        FieldDescriptor.TYPE_SINT64,
        FieldDescriptor.TYPE_FIXED64,
        FieldDescriptor.TYPE_SFIXED64,
    }
)


def message_to_json_dict(message: Message) -> dict[str, Any]:
    """Triton's JSON rendering of a protobuf message.

    ``MessageToDict`` renders 64-bit integers as strings (proto3 JSON mapping), but Triton and
    perf_analyzer read them as numbers, so they are turned back into ints by walking the descriptor.
    """
    raw: dict[str, Any] = json_format.MessageToDict(
        message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    _fix_int64(message, raw)
    return raw


def _fix_int64(message: Message, raw: dict[str, Any]) -> None:
    for field in message.DESCRIPTOR.fields:
        if field.name not in raw:
            continue
        value = raw[field.name]
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            value_field = field.message_type.fields_by_name["value"]
            submessages = getattr(message, field.name)
            for key in value:
                if value_field.message_type is not None:
                    # proto map keys are rendered as strings; look the entry up by its real key.
                    real_key = next(k for k in submessages if str(k) == key)
                    _fix_int64(submessages[real_key], value[key])
                elif value_field.type in _INT64_TYPES:
                    value[key] = int(value[key])
        elif field.message_type is not None:
            if _is_repeated(field):
                for sub, sub_raw in zip(getattr(message, field.name), value, strict=True):
                    _fix_int64(sub, sub_raw)
            else:
                _fix_int64(getattr(message, field.name), value)
        elif field.type in _INT64_TYPES:
            raw[field.name] = [int(v) for v in value] if _is_repeated(field) else int(value)


def _is_repeated(field: Any) -> bool:
    # ``label`` is deprecated in newer protobuf releases in favour of ``is_repeated``.
    is_repeated = getattr(field, "is_repeated", None)
    if is_repeated is not None:
        return bool(is_repeated)
    return bool(field.label == FieldDescriptor.LABEL_REPEATED)
