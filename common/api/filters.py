"""Strict list filters: a query value that is not valid is a 400, never ignored or guessed.

- Integers are integers (`?depth=0.5` is refused, where a decimal field took it), and fit in
  64 bits (`?tenant=2**70` is refused, where SQLite failed to bind it).
- Booleans are `true` or `false` (`?ready=null` is refused, where it meant "any").
- A parameter sent empty (`?created_before=`) is refused, where it meant "no filter"; the
  schema says so (`minLength: 1`, common/api/schema.py).
- A foreign key is filtered by id over the list the user may already see: an id that does not
  exist and one the user may not see give the same empty page. A choice of visible rows would
  answer 400 for the first and an empty page for the second, telling ids apart (an oracle).
"""

from __future__ import annotations

from typing import Any

import django_filters
from django import forms
from django.db import models
from django_filters import rest_framework as drf_filters


class StrictBooleanField(forms.Field):
    def to_python(self, value: Any) -> bool | None:
        if value in (None, ""):
            return None
        text = str(value).strip().lower()
        if text in ("true", "1"):
            return True
        if text in ("false", "0"):
            return False
        raise forms.ValidationError(f"must be true or false, got {str(value)[:20]!r}.")


class StrictBooleanFilter(django_filters.BooleanFilter):
    field_class = StrictBooleanField


class BoundedIntegerField(forms.IntegerField):
    """An integer a database column can hold (64 bits): SQLite cannot even bind a larger one
    (OverflowError, a 500), and no row has one, so it is refused as out of range."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("min_value", -(2**63))
        kwargs.setdefault("max_value", 2**63 - 1)
        super().__init__(*args, **kwargs)


class IntegerFilter(django_filters.NumberFilter):
    field_class = BoundedIntegerField


_INTEGER = {"filter_class": IntegerFilter}
STRICT_DEFAULTS = {
    **drf_filters.FilterSet.FILTER_DEFAULTS,
    models.AutoField: _INTEGER,
    models.IntegerField: _INTEGER,
    models.SmallIntegerField: _INTEGER,
    models.PositiveIntegerField: _INTEGER,
    models.PositiveSmallIntegerField: _INTEGER,
    models.BooleanField: {"filter_class": StrictBooleanFilter},
    models.ForeignKey: _INTEGER,
    models.OneToOneField: _INTEGER,
}


class StrictFilterSet(drf_filters.FilterSet):
    FILTER_DEFAULTS = STRICT_DEFAULTS

    def is_valid(self) -> bool:
        super().is_valid()
        for name in self.filters:
            if name in self.data and "" in self.data.getlist(name):
                self.form.add_error(name, "must not be empty; leave the parameter out instead.")
        return not self.form.errors


class StrictFilterBackend(drf_filters.DjangoFilterBackend):
    filterset_base = StrictFilterSet
