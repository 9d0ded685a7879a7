"""Who acts for which team (issue 30), resolved once per request, websocket and API token.

``Acting(team, user, role)`` is what services take instead of a user. A request acts in the team
its session chose (the header's switcher), else the user's personal team; an API token acts in the
one team it was made for; a websocket in the team of the session that opened it. Membership is
checked on every resolution, so a member who leaves loses the team at once.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from console.roles import Perm, can

if TYPE_CHECKING:
    from console.models import Team, User

SESSION_KEY = "acting_team"
SESSION_NAME_KEY = "acting_team_name"  # the header shows it without a query


def remember_team(session: Any, team: Team) -> None:
    """The session acts in ``team`` from now on (its personal team: the default, nothing kept)."""
    if team.personal_of_id is not None:
        forget_team(session)
        return
    session[SESSION_KEY] = str(team.public_id)
    session[SESSION_NAME_KEY] = team.name


def forget_team(session: Any) -> None:
    session.pop(SESSION_KEY, None)
    session.pop(SESSION_NAME_KEY, None)


class NotAMember(Exception):
    """The user is not (or no longer) a member of the team asked for."""


@dataclass(frozen=True)
class Acting:
    team: Team
    user: User
    role: str
    # Resolved for a request that changes something (POST, PUT, PATCH, DELETE): fetching a row
    # to act on then checks the member may operate it (``may_operate``), not only see it.
    writing: bool = False

    # A principal that acts: services asking "is someone signed in" get yes.
    is_authenticated = True
    is_anonymous = False

    def can(self, perm: Perm) -> bool:
        return can(self.role, perm)

    def may_operate(self, instance: Any) -> bool:
        """Operate (start, stop, release, open) an instance of the team: every one with
        ``operate_all``, one's own with ``compute``."""
        if instance.team_id != self.team.pk:
            return False
        if self.can(Perm.OPERATE_ALL):
            return True
        return self.can(Perm.COMPUTE) and instance.created_by_id == self.user.pk

    @property
    def team_id(self) -> int:
        return self.team.pk


def personal_team(user: User) -> Team:
    """The user's personal team (every account has one; made here if a row predates it)."""
    from console.models import Membership, Team

    cached = getattr(user, "_personal_team", None)
    if cached is not None:
        return cached
    team = Team.objects.filter(personal_of=user).first()
    if team is None:
        team, _ = Team.objects.get_or_create(
            personal_of=user, defaults={"name": user.get_username()}
        )
        Membership.objects.get_or_create(team=team, user=user, defaults={"role": "owner"})
    user._personal_team = team
    return team


@functools.cache
def _membership() -> Any:
    """A member's row in a team with the team joined: every API request with a token reads it
    (the token's team, checked on each request), so its SQL is built once per process
    (console/api/compiled.py)."""
    from console.api.compiled import CompiledQuery
    from console.models import Membership

    return CompiledQuery(
        lambda team, user: (
            Membership.objects.filter(team=team, user=user).select_related("team").order_by()
        ),
        team=Membership._meta.get_field("team"),
        user=Membership._meta.get_field("user"),
    )


def acting_in(user: User, team: Team | None = None) -> Acting:
    """Acting for ``user`` in ``team`` (default: their personal team). Raises NotAMember."""
    if team is None:
        team = personal_team(user)
        return Acting(team=team, user=user, role="owner")
    member = _membership().first(team=team.pk, user=user.pk)
    if member is None:
        raise NotAMember(team.pk)
    return Acting(team=team, user=user, role=member.role)


def member_role(team_id: int, user_id: int) -> str | None:
    """``user_id``'s role in team ``team_id``, None when not a member (read on every call)."""
    member = _membership().first(team=team_id, user=user_id)
    return None if member is None else str(member.role)


def acting_in_team_id(user: User, team_id: int) -> Acting:
    """``acting_in`` for a team known by its id (an API token's): the membership and the team in
    one query. Raises NotAMember, for a team that is gone too."""
    member = _membership().first(team=team_id, user=user.pk)
    if member is None:
        raise NotAMember(team_id)
    return Acting(team=member.team, user=user, role=member.role)


def team_of(who: Any) -> Team:
    """The team a service acts for: an ``Acting``'s team, a ``Team`` itself, or a user's
    personal team (management commands, the demo set-up and tests that act as one person)."""
    from console.models import Team

    if isinstance(who, Acting):
        return who.team
    if isinstance(who, Team):
        return who
    return personal_team(who)


def user_of(who: Any) -> Any:
    """The member behind an ``Acting`` or a user; None for a bare team."""
    from console.models import Team

    if isinstance(who, Acting):
        return who.user
    if isinstance(who, Team):
        return None
    return who


def as_acting(who: Any) -> Acting:
    if isinstance(who, Acting):
        return who
    return acting_in(who)


def resolve_request(request: Any) -> Acting | None:
    found = _resolve_request(request)
    if found is not None and (getattr(request, "method", "GET") or "GET").upper() not in SAFE:
        found = replace(found, writing=True)
    return found


SAFE = frozenset({"GET", "HEAD", "OPTIONS", "TRACE"})


def _resolve_request(request: Any) -> Acting | None:
    """The request's Acting: the API token's team, else the session's choice, else personal."""
    from console.models import Team

    user = getattr(request, "user", None)
    if user is None or not getattr(user, "is_authenticated", False):
        return None
    token = getattr(request, "auth", None)
    token_team_id = getattr(token, "team_id", None)
    if token_team_id is not None:
        checked = getattr(token, "acting", None)  # read by the authentication, this request
        if isinstance(checked, Acting) and checked.user == user:
            return checked
        try:
            return acting_in_team_id(user, token_team_id)
        except NotAMember:
            return None
    session = getattr(request, "session", None)
    chosen = session.get(SESSION_KEY) if session is not None else None
    if chosen:
        team = Team.objects.filter(public_id=chosen).first()
        if team is not None:
            try:
                found = acting_in(user, team)
            except NotAMember:
                pass
            else:
                if session.get(SESSION_NAME_KEY) != team.name:
                    session[SESSION_NAME_KEY] = team.name  # renamed meanwhile
                return found
        forget_team(session)  # left or removed: back to the personal team
    return acting_in(user)


def resolve_scope(scope: Any) -> Acting | None:
    """A websocket's Acting: the team its session chose (as the page that opened it), else the
    user's personal team; None for an anonymous socket or a team the user has left."""
    user = scope.get("user")
    if user is None or not getattr(user, "is_authenticated", False):
        return None
    from console.models import Team

    session = scope.get("session")
    chosen = session.get(SESSION_KEY) if session is not None else None
    if chosen:
        team = Team.objects.filter(public_id=chosen).first()
        if team is not None:
            try:
                return acting_in(user, team)
            except NotAMember:
                return None
    return acting_in(user)


def acting(request: Any) -> Any:
    """The request's Acting, resolved once and kept on the request (views call this). An
    anonymous visitor stays the anonymous user (services answer them as before: nothing)."""
    user = getattr(request, "user", None)
    if user is None or not getattr(user, "is_authenticated", False):
        return user
    cached = getattr(request, "_acting", None)
    if cached is None:
        cached = resolve_request(request)
        if cached is None:
            raise NotAMember(None)
        request._acting = cached
    return cached


def contacts(team: Team, roles: tuple[str, ...] = ("owner", "billing")) -> list[User]:
    """Who hears about the team's money (low balance, invoices, bills): its owners and billing
    members; for a personal team, its person."""
    from console.models import User

    if team.personal_of_id is not None:
        return list(User.objects.filter(pk=team.personal_of_id))
    return list(
        User.objects.filter(memberships__team=team, memberships__role__in=roles).order_by("pk")
    )


def contact(team: Team) -> User:
    """The first of ``contacts(team)``: the team's person for a personal team, else its first
    owner (mails that go to one address)."""
    people = contacts(team, ("owner",)) or contacts(team)
    return people[0]


def for_row(row: Any) -> Acting:
    """Acting for a team-owned row's own team and maker: what background work (a start, a
    migration, a settlement) passes to services on the row's behalf. Its role grants nothing:
    permissions are checked at the doors, never on this path."""
    return Acting(team=row.team, user=row.created_by, role="system")
