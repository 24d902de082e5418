"""`field__any=values`: membership in a list sent as one parameter.

`field__in=values` sends one parameter per value. With the thousands of ids the scheduler
daemon reads or locks in a cycle, Django prepares each and PostgreSQL parses each; as one
array (`field = ANY(%s)`) the list costs about what a single value does. Other databases
have no arrays: there it is `IN`.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import EmptyResultSet
from django.db.models import Field, ForeignObject, Lookup
from django.db.models.lookups import In


class AnyOf(Lookup):  # type: ignore[type-arg]
    lookup_name = "any"
    prepare_rhs = False  # the list is the parameter: not one value of the field

    def as_sql(self, compiler: Any, connection: Any) -> Any:
        values = list(self.rhs)
        if not values:  # as `__in`: no query is sent for an empty list
            raise EmptyResultSet
        if connection.vendor != "postgresql":
            sql, params = compiler.compile(In(self.lhs, values))
            return sql, list(params)
        lhs, params = self.process_lhs(compiler, connection)
        return f"{lhs} = ANY(%s)", [*params, values]


Field.register_lookup(AnyOf)
ForeignObject.register_lookup(AnyOf)  # related fields keep lookups of their own
