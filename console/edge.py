"""The production edge (issue 34): nginx in front of the web tier.

``render`` fills ``deploy/nginx/console.conf.in`` from the settings: the address nginx listens
on, the web processes behind it, the collected static files it serves itself, the request-body
limit of each route (``REQUEST_BODY_LIMITS``, the same table ``console.bodylimit`` applies in
Python, so a body over its limit never reaches a web process), and the app hosts
``<id>-<port>.<APPS_DOMAIN>``, whose every request nginx first asks the console about
(``auth_request`` to ``/__gpc/edge-auth``, ``slices.edge_views``) and then moves the bytes itself.

nginx runs as the console's own user, unprivileged, with its pid file, logs and temporary
folders under ``$STATE_DIR/edge/`` (``EDGE_DIR``), so tests and CI start their own beside
anything else. ``manage.py edge`` renders and runs it (the Procfile's ``edge``).
"""

from __future__ import annotations

import getpass
import hashlib
import hmac
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from django.conf import settings

TEMPLATE = Path(__file__).resolve().parent.parent / "deploy" / "nginx" / "console.conf.in"
NGINX = "/usr/sbin/nginx"
SECRET_HEADER = "X-Gpc-Edge"  # noqa: S105 - a header name
TEMP_FOLDERS = ("body", "proxy", "fastcgi", "uwsgi", "scgi")


def edge_dir() -> Path:
    return Path(getattr(settings, "EDGE_DIR", "") or Path(settings.STATE_DIR) / "edge")


def edge_secret() -> str:
    """What nginx's auth subrequest carries to show it is the edge's: the console answers
    ``/__gpc/edge-auth`` (which names an instance's token) to nothing else."""
    key = str(settings.SECRET_KEY).encode()
    return hmac.new(key, b"gpc-edge-auth-v1", hashlib.sha256).hexdigest()


def is_edge(request_secret: str) -> bool:
    return bool(request_secret) and hmac.compare_digest(request_secret, edge_secret())


@dataclass(frozen=True)
class EdgeOptions:
    listen: str  # "127.0.0.1:8000"
    web: tuple[str, ...]  # the web processes: "127.0.0.1:8001", "unix:/path.sock"
    prefix: Path
    static_root: Path
    apps_domain: str
    default_limit: int
    port_proxy_limit: int
    limits: tuple[tuple[str, int], ...] = field(default_factory=tuple)
    workers: str = "auto"
    access_log: bool = False
    behind_tls: bool = False  # a TLS-terminating proxy in front sets X-Forwarded-Proto


def options(
    listen: str, web: tuple[str, ...], *, workers: str = "auto", access_log: bool = False
) -> EdgeOptions:
    """The edge's options from the settings."""
    static_root = settings.STATIC_ROOT or Path(settings.STATE_DIR) / "staticfiles"
    return EdgeOptions(
        listen=listen,
        web=web,
        prefix=edge_dir(),
        static_root=Path(static_root),
        apps_domain=str(settings.APPS_DOMAIN or "localhost").strip(".").lower(),
        default_limit=int(settings.REQUEST_BODY_MAX_BYTES),
        port_proxy_limit=int(settings.PORT_PROXY_BODY_MAX_BYTES),
        limits=tuple((str(p), int(n)) for p, n in settings.REQUEST_BODY_LIMITS),
        workers=workers,
        access_log=access_log,
        behind_tls=_behind_tls(),
    )


def _behind_tls() -> bool:
    """Whether a TLS-terminating proxy in front of the edge says the scheme
    (``EDGE_FORWARDED_PROTO=header``, the default when ``BEHIND_TLS_PROXY`` is on) or nginx's own
    ``$scheme`` is the truth (``scheme``: nginx terminates TLS itself, or plain HTTP; a client's
    ``X-Forwarded-Proto`` is then overwritten, never believed)."""
    default = "header" if getattr(settings, "SECURE_PROXY_SSL_HEADER", None) else "scheme"
    value = os.environ.get("EDGE_FORWARDED_PROTO", default).strip().lower()
    if value not in ("header", "scheme"):
        raise ValueError(f"EDGE_FORWARDED_PROTO={value!r}: header or scheme")
    return value == "header"


_SAFE_PATTERN = re.compile(r"[A-Za-z0-9_/\-\[\]\^\(\)\|\+\*\?\.\$]+")


def _limit_locations(limits: tuple[tuple[str, int], ...]) -> str:
    out = []
    for pattern, limit in limits:
        if not _SAFE_PATTERN.fullmatch(pattern):
            raise ValueError(f"REQUEST_BODY_LIMITS pattern {pattern!r} cannot go into nginx")
        out.append(
            f'        location ~ "^{pattern}" {{\n'
            f"            client_max_body_size {int(limit)};\n"
            f"            proxy_pass http://gpc_web;\n"
            f"        }}\n"
        )
    return "\n".join(out)


def _web_servers(web: tuple[str, ...]) -> str:
    lines = []
    for server in web:
        if not re.fullmatch(r"(unix:/[\w./\-]+|[\w.\-]+:\d+|\[[0-9a-fA-F:]+\]:\d+)", server):
            raise ValueError(f"web server {server!r}: host:port or unix:/path")
        lines.append(f"        server {server};")
    return "\n".join(lines)


def render(opts: EdgeOptions) -> str:
    """The nginx configuration for ``opts``."""
    if not re.fullmatch(r"[a-z0-9.\-]+", opts.apps_domain):
        raise ValueError(f"APPS_DOMAIN {opts.apps_domain!r}")
    if not re.fullmatch(r"([\w.\-]+|\[[0-9a-fA-F:]+\]):\d+|\d+", opts.listen):
        raise ValueError(f"listen {opts.listen!r}: host:port")
    user = ""
    if os.geteuid() == 0:
        # Started as root (a container): the workers stay root's too, not nobody, since they
        # read the console's static files and its tunnels' sockets (0600). Unprivileged is
        # better: run the Procfile as the console's user and this line is not written.
        user = f"user {getpass.getuser()};"
    values = {
        "USER": user,
        "WORKERS": opts.workers,
        "PREFIX": str(opts.prefix),
        "ACCESS_LOG": f"{opts.prefix}/logs/access.log" if opts.access_log else "off",
        "WEB_SERVERS": _web_servers(opts.web),
        "LISTEN": opts.listen,
        "FORWARDED_PROTO": "$http_x_forwarded_proto" if opts.behind_tls else "$scheme",
        "DEFAULT_LIMIT": str(opts.default_limit),
        "PORT_PROXY_LIMIT": str(opts.port_proxy_limit),
        "STATIC_ROOT": str(opts.static_root),
        "LIMIT_LOCATIONS": _limit_locations(opts.limits),
        "APPS_DOMAIN": opts.apps_domain,
        "APPS_DOMAIN_RE": re.escape(opts.apps_domain),
        "EDGE_SECRET": edge_secret(),
    }
    text = TEMPLATE.read_text()
    for name, value in values.items():
        text = text.replace(f"@@{name}@@", value)
    left = re.findall(r"@@[A-Z_]+@@", text)
    if left:
        raise ValueError(f"unfilled in the template: {left}")
    return text


def write(opts: EdgeOptions) -> Path:
    """Render into ``<prefix>/nginx.conf`` (0600: it holds the edge's secret) and make the
    folders nginx writes to; the file's path."""
    prefix = opts.prefix
    for folder in ("logs", "tmp", *(f"tmp/{name}" for name in TEMP_FOLDERS), "tunnels"):
        (prefix / folder).mkdir(parents=True, exist_ok=True, mode=0o700)
    conf = prefix / "nginx.conf"
    tmp = prefix / "nginx.conf.new"
    tmp.write_text(render(opts))
    tmp.chmod(0o600)
    tmp.replace(conf)
    return conf


def command(conf: Path, prefix: Path) -> list[str]:
    """nginx's argv for ``conf`` (foreground; its startup log under ``prefix``, never
    /var/log/nginx)."""
    return [NGINX, "-p", f"{prefix}/", "-e", f"{prefix}/logs/error.log", "-c", str(conf)]
