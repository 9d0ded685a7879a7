"""console/api/compiled.py: a queryset whose SQL is built once answers exactly what the ORM answers
for every call's values (the related rows, the prefetches, a list of values, no rows), without
building SQL again; a query it cannot run that way is refused when built, never run wrong."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.db.models import Model
from django.db.models.sql.compiler import SQLCompiler
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from console.api import compiled
from console.api.compiled import CompiledQuery, Many, prefetched, prefetched_many
from console.models import ApiToken, SshKey, User
from tests.console.factories import UserFactory, make_api_token, make_ssh_key

pytestmark = pytest.mark.django_db

TOKEN = CompiledQuery(
    lambda prefix: ApiToken.objects.select_related("owner").filter(prefix=prefix),
    prefix=ApiToken._meta.get_field("prefix"),
)
KEYS_OF = CompiledQuery(
    lambda owners: SshKey.objects.filter(owner__in=owners).order_by("id"),
    owners=Many(SshKey._meta.get_field("owner")),
)
TOKENS_USED_SINCE = CompiledQuery(
    lambda active, owner, since: (
        ApiToken.objects.filter(owner=owner, last_used_at__gt=since, public_id__isnull=False)
        .filter(revoked_at__isnull=active)
        .prefetch_related("owner__ssh_keys")
        .order_by("-last_used_at")
    ),
    owner=ApiToken._meta.get_field("owner"),
    since=ApiToken._meta.get_field("last_used_at"),
)


def _fields(obj: Model) -> dict:
    return {k: v for k, v in vars(obj).items() if not k.startswith("_")}


def test_a_row_with_its_related_row_is_the_orms_and_the_sql_is_built_once(monkeypatch) -> None:
    alice, bob = UserFactory(), UserFactory()
    mine, _ = make_api_token(alice)
    theirs, _ = make_api_token(bob)
    TOKEN.first(prefix=mine.prefix)  # built here, if no other test built it first

    built = []
    original = SQLCompiler.as_sql
    monkeypatch.setattr(
        SQLCompiler, "as_sql", lambda self, *a, **k: built.append(1) or original(self, *a, **k)
    )
    with CaptureQueriesContext(connection) as ctx:
        found = [TOKEN.first(prefix=t.prefix) for t in (mine, theirs)]
        missing = TOKEN.first(prefix="000000000000")
    assert built == [] and len(ctx.captured_queries) == 3  # one query each, no SQL built

    monkeypatch.undo()
    for token, got in zip((mine, theirs), found, strict=True):
        orm = ApiToken.objects.select_related("owner").get(prefix=token.prefix)
        assert _fields(got) == _fields(orm) and _fields(got.owner) == _fields(orm.owner)
        assert got.owner.email == orm.owner.email and not got._state.adding
        assert got._state.db == "default"
    assert missing is None
    with CaptureQueriesContext(connection) as ctx:
        assert found[0].owner.username == alice.username  # joined: no query
    assert ctx.captured_queries == []


def test_a_list_of_values_pads_to_a_few_statements_and_drops_repeats() -> None:
    users = [UserFactory() for _ in range(5)]
    keys = {u.pk: make_ssh_key(u) for u in users}
    for n in range(6):
        owners = [u.pk for u in users[:n]]
        got = KEYS_OF.all(owners=owners + owners[:1])  # a repeat changes nothing
        assert [k.pk for k in got] == sorted(keys[o].pk for o in owners)
    with CaptureQueriesContext(connection) as ctx:
        assert KEYS_OF.all(owners=[]) == []  # nothing to match: no query
    assert ctx.captured_queries == []
    # 1, 2, 3-4, 5 (as 8) values: four statements serve every length up to 8
    assert {key[-1] for key in KEYS_OF._statements} == {1, 2, 4, 8}


def test_shapes_datetimes_and_prefetches_answer_as_the_orm() -> None:
    alice, bob = UserFactory(), UserFactory()
    make_ssh_key(alice)
    now = timezone.now()
    tokens = [make_api_token(alice, name=f"t{i}")[0] for i in range(3)] + [make_api_token(bob)[0]]
    for i, token in enumerate(tokens):
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now - timedelta(minutes=i))
    ApiToken.objects.filter(pk=tokens[1].pk).update(revoked_at=now)
    since = now - timedelta(seconds=90)
    for active in (True, False):
        got = TOKENS_USED_SINCE.all(active, owner=alice.pk, since=since)
        orm = list(
            ApiToken.objects.filter(owner=alice, last_used_at__gt=since)
            .filter(revoked_at__isnull=active)
            .order_by("-last_used_at")
        )
        assert [t.pk for t in got] == [t.pk for t in orm] and got
        with CaptureQueriesContext(connection) as ctx:
            assert [k.name for k in got[0].owner.ssh_keys.all()] == [
                k.name for k in alice.ssh_keys.all()
            ]
        assert len(ctx.captured_queries) == 1  # the prefetch came with the rows
    assert set(TOKENS_USED_SINCE._statements) == {(True,), (False,)}


def test_past_the_kept_shapes_the_orm_answers(monkeypatch) -> None:
    alice = UserFactory()
    make_ssh_key(alice, name="a")
    make_ssh_key(alice, name="b")
    pages = CompiledQuery(
        lambda offset, owner: SshKey.objects.filter(owner=owner).order_by("name")[offset:],
        owner=SshKey._meta.get_field("owner"),
    )
    monkeypatch.setattr(compiled, "MAX_SHAPES", 1)
    assert [k.name for k in pages.all(0, owner=alice.pk)] == ["a", "b"]
    assert [k.name for k in pages.all(1, owner=alice.pk)] == ["b"]  # not kept, still right
    assert list(pages._statements) == [(0,)]


@pytest.mark.parametrize(
    ("build", "error"),
    [
        (lambda name: SshKey.objects.filter(name__contains=name), ValueError),  # wrapped in %
        (lambda name: SshKey.objects.filter(name=name).values("id"), TypeError),
        (lambda name: SshKey.objects.filter(name=name, comment=name), ValueError),  # twice
        (lambda name: SshKey.objects.filter(pk=1), ValueError),  # never reaches the SQL
    ],
)
def test_a_query_it_cannot_run_that_way_is_refused_when_built(build, error) -> None:
    query = CompiledQuery(build, name=SshKey._meta.get_field("name"))
    with pytest.raises(error):
        query.all(name="laptop")
    with pytest.raises(TypeError):
        TOKEN.all(prefix="x", other=1)  # values it does not take


def test_prefetched_rows_answer_all_without_a_query_and_filter_stays_scoped() -> None:
    alice, bob = UserFactory(), UserFactory()
    make_api_token(alice, name="a1")
    make_api_token(alice, name="a2")
    make_api_token(bob, name="b1")
    users = list(User.objects.filter(pk__in=[alice.pk, bob.pk]).order_by("pk"))
    rows = list(ApiToken.objects.filter(owner__in=users))
    prefetched_many(users, "api_tokens", rows)
    with CaptureQueriesContext(connection) as ctx:
        names = {u.username: sorted(t.name for t in u.api_tokens.all()) for u in users}
        assert all(t.owner is u for u in users for t in u.api_tokens.all())
    assert ctx.captured_queries == []
    assert names == {alice.username: ["a1", "a2"], bob.username: ["b1"]}
    # A filter asks the database, for this user's rows only (as after prefetch_related).
    assert [t.name for t in users[0].api_tokens.filter(name__startswith="b")] == []
    assert [t.name for t in users[1].api_tokens.filter(name__startswith="b")] == ["b1"]
    prefetched(users[0], "api_tokens", [])
    assert list(users[0].api_tokens.all()) == []


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
def test_on_postgresql_a_kept_statement_runs_prepared_and_answers_as_the_orm(settings) -> None:
    """DB_PREPARED: the server parses and plans the statement once per connection; the rows, the
    related rows and the captured queries are the ORM's; DB_PREPARED=false binds on the client."""
    assert connection.vendor == "postgresql", "run with DATABASE_URL (make test-integration)"
    settings.DB_PREPARED = True
    alice, bob = UserFactory(), UserFactory()
    keys = [make_ssh_key(alice, name="a"), make_ssh_key(bob, name="b")]
    mine, _ = make_api_token(alice)

    def prepared() -> list[str]:
        with connection.cursor() as cursor:
            cursor.execute("SELECT statement FROM pg_prepared_statements")
            return [row[0] for row in cursor.fetchall()]

    with CaptureQueriesContext(connection) as ctx:
        for _ in range(3):
            token = TOKEN.first(prefix=mine.prefix)
            listed = KEYS_OF.all(owners=[alice.pk, bob.pk, alice.pk])
    assert token is not None and token.owner == alice and token.owner.username == alice.username
    assert _fields(token) == _fields(ApiToken.objects.get(pk=mine.pk))
    assert [k.pk for k in listed] == [k.pk for k in keys]
    assert [_fields(k) for k in listed] == [_fields(k) for k in SshKey.objects.order_by("id")]
    assert len(ctx.captured_queries) == 6  # logged as any query is
    tokens, keys_table = ApiToken._meta.db_table, SshKey._meta.db_table
    statements = prepared()
    assert sum(f'FROM "{tokens}"' in s for s in statements) == 1  # prepared once, run 3 times
    assert sum(f'FROM "{keys_table}"' in s for s in statements) == 1

    settings.DB_PREPARED = False
    connection.close()  # a fresh connection: nothing prepared on it yet
    assert TOKEN.first(prefix=mine.prefix) == token
    assert KEYS_OF.all(owners=[bob.pk]) == [keys[1]]
    assert not [s for s in prepared() if tokens in s or keys_table in s]


@pytest.mark.parametrize("kind", sorted(compiled._INTEGER))  # noqa: SLF001
def test_an_integer_placeholder_is_inside_its_fields_range(kind: str) -> None:
    """A value outside an integer field's range is refused by the lookup itself (EmptyResultSet
    when the SQL is built): a port, a PositiveIntegerField, once got a negative placeholder."""
    from django.db import models

    field = getattr(models, kind)(primary_key=kind.endswith("AutoField"))
    low, high = connection.ops.integer_field_range(kind)
    for index in (0, 7, 63):
        value = compiled._placeholder(field, index)  # noqa: SLF001
        assert (low is None or value >= low) and (high is None or value <= high), (kind, value)
