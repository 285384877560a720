"""Reads the ORM writes once: a query whose SQL stays the same from call to call but for a few parameter values (a
moment: "ended since"), compiled by Django the first time and then run again with the new values put in its
parameters, its rows converted by the same compiler (a Trunc's hour made aware, as the ORM does).

Home's outcome counts per hour (an aggregate with annotations, a filtered count and an EXISTS) took 2.2 ms of CPU on
every request read through the ORM, 0.5 compiled once (in-process, bench/pages.py's 1,000,000 tasks), most of it
building and compiling the query. The query stays the ORM's (its rules keep one home); only its compiling is kept,
per connection (a compiler holds its connection: each thread's own) and key.

The caller's key names everything the SQL depends on but the values: build(*stand_ins) must give the same SQL for
every call under one key (a queryset read off a person's own rules does not: key it by what it reads, or do not
keep it). Each stand-in must appear exactly once among the compiled parameters; otherwise the query is compiled on
every call, as without this.
"""

import datetime
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from django.core.exceptions import EmptyResultSet
from django.db import connections
from django.db.models.query import ValuesListIterable
from django.db.models.sql.compiler import SQLCompiler

from taskhub.database.prepared import prepared_cursor

KEPT_READS = 256
# On each connection (each thread has its own), gone with it: {the key: the read, or None where it cannot be kept}.
KEPT_ON = "taskhub_compiled_reads"


@dataclass(frozen=True)
class CompiledRead:
    compiler: SQLCompiler
    sql: str
    params: tuple
    positions: tuple[int, ...]  # where each stand-in's value goes among the parameters

    def rows(self, values: Sequence) -> list:
        params = list(self.params)
        for position, value in zip(self.positions, values, strict=True):
            params[position] = value
        with prepared_cursor(self.compiler.connection) as cursor:
            cursor.execute(self.sql, params)
            fetched = cursor.fetchall()
        return list(self.compiler.results_iter(results=[fetched], tuple_expected=True))


def stand_in_moment(n: int) -> datetime.datetime:
    """A moment no caller's value equals, the n-th of a query's stand-ins."""
    return datetime.datetime(1111, 11, 11, 11, 11, 11, 100_000 + n, tzinfo=datetime.UTC)


def compiled_rows(
    key: tuple, build: Callable[..., Any], values: Sequence[datetime.datetime], *, using: str = "default"
) -> list:
    """The rows of build(*values) (a queryset of values_list on the database `using`), as the ORM would read them,
    its SQL compiled once per connection and key with stand-ins for the values (moments)."""
    connection = connections[using]
    kept = connection.__dict__.get(KEPT_ON)
    if kept is None:
        kept = connection.__dict__[KEPT_ON] = {}
    if key not in kept:
        stand_ins = [stand_in_moment(n) for n in range(len(values))]
        if len(kept) >= KEPT_READS:
            kept.clear()
        kept[key] = _compiled(build(*stand_ins).using(using), stand_ins)
    read = kept[key]
    if read is None:  # the stand-ins were not found where the values go: the ORM's read, each time
        return list(build(*values).using(using))
    return read.rows(values)


def _compiled(queryset, stand_ins: list) -> CompiledRead | None:
    if queryset._iterable_class is not ValuesListIterable:  # a row as the ORM gives it is what results_iter gives
        return None
    compiler = queryset.query.get_compiler(queryset.db)
    try:
        sql, params = compiler.as_sql()
    except EmptyResultSet:  # nothing to read: the ORM says so without a statement
        return None
    positions = []
    for stand_in in stand_ins:
        found = [n for n, param in enumerate(params) if type(param) is type(stand_in) and param == stand_in]
        if len(found) != 1:
            return None
        positions.append(found[0])
    return CompiledRead(compiler=compiler, sql=sql, params=tuple(params), positions=tuple(positions))


def forget_compiled_reads() -> None:
    """This thread's compiled reads."""
    for connection in connections.all(initialized_only=True):
        connection.__dict__.pop(KEPT_ON, None)
