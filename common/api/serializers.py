"""Input serializers that take JSON as it is: no undeclared field, no value of the wrong type.

DRF coerces on input: `{"name": 0}` becomes the name "0", `"true"` a boolean, `"5"` an
integer, and an empty string for a relation means null. An API that is strict about input
says instead what was wrong, so every input serializer of the API derives from
`StrictInputSerializer`. A body that is not a JSON object is a 400 with the error shape, not
a crash in DRF's error collection.
"""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

_JSON_TYPE = {
    bool: "a boolean",
    int: "a number",
    float: "a number",
    str: "a string",
    list: "an array",
    dict: "an object",
}


def _kind(value: Any) -> str:
    return _JSON_TYPE.get(type(value), type(value).__name__)


def type_error(field: serializers.Field, value: Any) -> str | None:
    """Why `value` is the wrong JSON type for `field`, or None when it is the right one."""
    if value is None:
        return None  # the field's own allow_null decides
    if isinstance(field, serializers.SlugRelatedField):  # a name: `0` is not the name "0"
        if not isinstance(value, str):
            return f"must be a string, got {_kind(value)}."
        return "must not be empty." if value == "" else None
    if isinstance(field, serializers.PrimaryKeyRelatedField):
        if isinstance(value, bool) or not isinstance(value, int):
            return f"must be a whole number, got {_kind(value)}."
        return None
    if isinstance(field, serializers.RelatedField):
        if value == "":
            return "must not be empty."
        return None
    if isinstance(field, serializers.BooleanField):
        return None if isinstance(value, bool) else f"must be true or false, got {_kind(value)}."
    if isinstance(field, serializers.IntegerField):
        if isinstance(value, bool) or not isinstance(value, int):
            return f"must be a whole number, got {_kind(value)}."
        return None
    if isinstance(field, serializers.FloatField | serializers.DecimalField):
        if isinstance(value, bool) or not isinstance(value, int | float):
            return f"must be a number, got {_kind(value)}."
        return None
    if isinstance(field, serializers.CharField | serializers.ChoiceField):
        if not isinstance(value, str):
            return f"must be a string, got {_kind(value)}."
        # The schema's maxLength counts what was sent; DRF counts it after trimming spaces.
        limit = getattr(field, "max_length", None)
        if limit is not None and len(value) > limit:
            return f"Ensure this field has no more than {limit} characters."
        return None
    return None


def refuse_loose_input(serializer: serializers.Serializer, data: Any) -> None:
    """The checks of `StrictInputSerializer`, for model serializers used as input too."""
    if not isinstance(data, dict):
        raise serializers.ValidationError(
            {"non_field_errors": [f"expected a JSON object, got {_kind(data)}."]}
        )
    writable = {name for name, field in serializer.fields.items() if not field.read_only}
    errors: dict[str, list[str]] = {
        key[:64]: ["unknown or read-only field."] for key in sorted(set(data) - writable)[:20]
    }
    for name in writable & set(data):
        problem = type_error(serializer.fields[name], data[name])
        if problem:
            errors[name] = [problem]
    if errors:
        raise serializers.ValidationError(errors)


class StrictInputSerializer(serializers.Serializer):
    """Refuses undeclared fields by name (a typo or a privilege grab) and values of the wrong
    JSON type (an integer where a string is expected), field by field."""

    def to_internal_value(self, data: Any) -> Any:
        refuse_loose_input(self, data)
        return super().to_internal_value(data)


class EmptyIn(StrictInputSerializer):
    """The body of an action that takes no field (withdraw, test a webhook): nothing, `{}`, or
    a 400 naming each field sent, as every other write answers a field it does not take."""


def refuse_any_body(data: Any) -> None:
    """Raise the 400 of `EmptyIn` unless `data` (a request's body) holds no field."""
    EmptyIn(data=data).is_valid(raise_exception=True)
