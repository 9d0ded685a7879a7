"""Domain-free bulk SQL: many rows inserted or updated in one statement, on PostgreSQL and SQLite.

Used by the bulk settlement (billing/settlement.py), whose constant number of statements keeps
10,000 sessions under a second; nothing here knows about money.
"""

from __future__ import annotations

import json
from datetime import datetime
from decimal import Decimal
from typing import Any, cast

from django.db import connection, models

# Bulk statements. Identifiers come from model metadata and every value is a parameter, so the
# f-strings below carry no user input (hence the S608 waivers).
_SQLITE_MAX_PARAMS = 30000  # SQLite >= 3.32 allows 32,766; Django itself assumes 999


def pg_array_type(field: models.Field) -> str:
    return f"{field.db_type(connection)}[]"


def pg_array(values: list[Any]) -> str:
    """A PostgreSQL array literal (``{1,"a b",NULL}``), cast by the statement to the column type.

    Much cheaper than letting the driver adapt 10,000 Python objects one by one; every element
    is quoted and escaped, so text is safe.
    """
    parts = []
    for v in values:
        if v is None:
            parts.append("NULL")
        elif isinstance(v, int | Decimal):
            parts.append(str(v))
        else:
            if isinstance(v, dict | list):  # a JSON column's value
                text = json.dumps(v)
            else:
                text = v.isoformat() if isinstance(v, datetime) else str(v)
            parts.append('"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"')
    return "{" + ",".join(parts) + "}"


def insert_rows(
    model: type[models.Model], names: list[str], rows: list[list[Any]], returning: bool = False
) -> list[int]:
    """``INSERT`` many rows in one statement; returns their ids (in row order) when asked.

    PostgreSQL: ``INSERT … SELECT * FROM unnest(%s::type[], …)`` — one parameter per column,
    whatever the number of rows. SQLite: multi-row VALUES, split at its parameter limit; ids come
    back through ``RETURNING id, public_id`` and are matched on public_id (order is not promised).
    """
    if not rows:
        return []
    fields = [cast(models.Field, model._meta.get_field(n)) for n in names]
    qn = connection.ops.quote_name
    table = qn(model._meta.db_table)
    columns = ", ".join(qn(cast(str, f.column)) for f in fields)
    ids: list[int] = []
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            arrays = ", ".join(f"%s::{pg_array_type(f)}" for f in fields)
            sql = f"INSERT INTO {table} ({columns}) SELECT * FROM unnest({arrays})"  # noqa: S608
            if returning:
                sql += " RETURNING id, public_id"
            cursor.execute(sql, [pg_array([r[i] for r in rows]) for i in range(len(fields))])
            if not returning:
                return []
            # RETURNING promises no order: match the new ids on public_id (the first column).
            pk_of = {public_id: pk for pk, public_id in cursor.fetchall()}
            return [pk_of[r[0]] for r in rows]
        chunk = max(1, _SQLITE_MAX_PARAMS // len(fields))
        row_sql = "(" + ", ".join(["%s"] * len(fields)) + ")"
        for start in range(0, len(rows), chunk):
            part = rows[start : start + chunk]
            params = [
                f.get_db_prep_save(v, connection)
                for r in part
                for f, v in zip(fields, r, strict=True)
            ]
            sql = f"INSERT INTO {table} ({columns}) VALUES {', '.join([row_sql] * len(part))}"  # noqa: S608
            if returning:
                sql += " RETURNING id, public_id"
            cursor.execute(sql, params)
            if returning:
                pk_of = {str(public_id).replace("-", ""): pk for pk, public_id in cursor.fetchall()}
                ids.extend(pk_of[r[0].hex] for r in part)
    return ids


def bulk_set(model: type[models.Model], columns: list[str], rows: list[tuple[int, list]]) -> None:
    """``UPDATE t SET col = v.col … FROM (…) v WHERE t.id = v.id`` in one statement.

    Django's ``bulk_update`` builds one CASE per column, whose cost grows with rows × rows on
    PostgreSQL; a join is linear. PostgreSQL: ``unnest`` of one array per column. SQLite: a
    VALUES list (values prepared by each field), split at its parameter limit.
    """
    if not rows:
        return
    fields = [cast(models.Field, model._meta.get_field(c)) for c in columns]
    qn = connection.ops.quote_name
    table = qn(model._meta.db_table)
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            names = ", ".join(["id", *[f"c{i}" for i in range(len(fields))]])
            arrays = ", ".join(["%s::bigint[]", *[f"%s::{pg_array_type(f)}" for f in fields]])
            sets = ", ".join(f"{qn(cast(str, f.column))} = v.c{i}" for i, f in enumerate(fields))
            sql = f"UPDATE {table} AS t SET {sets} FROM unnest({arrays}) AS v({names}) WHERE t.id = v.id"  # noqa: S608
            arrays_params = [pg_array([pk for pk, _v in rows])]
            arrays_params += [
                pg_array([values[i] for _pk, values in rows]) for i in range(len(fields))
            ]
            cursor.execute(sql, arrays_params)
            return
        width = len(fields) + 1
        chunk = max(1, _SQLITE_MAX_PARAMS // width)
        sets = ", ".join(
            f"{qn(cast(str, f.column))} = v.column{i + 2}" for i, f in enumerate(fields)
        )
        for start in range(0, len(rows), chunk):
            part = rows[start : start + chunk]
            params: list[Any] = []
            for pk, values in part:
                params.append(pk)
                params.extend(
                    f.get_db_prep_save(v, connection) for f, v in zip(fields, values, strict=True)
                )
            placeholders = ", ".join(["(" + ", ".join(["%s"] * width) + ")"] * len(part))
            sql = f"UPDATE {table} SET {sets} FROM (VALUES {placeholders}) AS v WHERE {table}.id = v.column1"  # noqa: S608
            cursor.execute(sql, params)
