"""Failed-login lockout for login forms outside allauth (the Django admin's).

Shares allauth's ``login_failed`` counter and key, so five wrong passwords for an account lock it
on every form (console and admin) for the configured window, without locking out the IP; and the
per-IP ``login`` budget, so spraying passwords over many names through the admin is throttled too.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps

from allauth.core import ratelimit
from django.http import HttpRequest, HttpResponse

from console.adapters import login_attempts_key


def limit_failed_logins(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    @wraps(view)
    def wrapper(request: HttpRequest, *args: object, **kwargs: object) -> HttpResponse:
        if request.method != "POST":
            return view(request, *args, **kwargs)
        # The console's per-IP budget for login attempts ("login"), one budget for both forms:
        # password spraying over many names is throttled, not only guessing one name.
        if not ratelimit.consume(request, action="login"):
            return ratelimit.respond_429(request)
        login = request.POST.get("username", "")
        if not login:
            return view(request, *args, **kwargs)
        key = login_attempts_key(login)  # the key our allauth adapter uses: one counter
        if not ratelimit.consume(request, action="login_failed", key=key, dry_run=True):
            return ratelimit.respond_429(request)
        response = view(request, *args, **kwargs)
        if not request.user.is_authenticated:
            ratelimit.consume(request, action="login_failed", key=key)
        return response

    return wrapper
