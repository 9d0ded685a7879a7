"""Render the edge's nginx configuration and run nginx in the foreground (issue 34).

manage.py edge --listen 0.0.0.0:8000 --web 127.0.0.1:8001   # the Procfile's edge
manage.py edge --render-only                               # write it, print its path
"""

from __future__ import annotations

import os
import shutil
import subprocess

from django.core.management.base import BaseCommand, CommandError

from console import edge


class Command(BaseCommand):
    help = "Render the nginx edge's configuration and run nginx in the foreground."

    def add_arguments(self, parser) -> None:  # noqa: ANN001
        parser.add_argument("--listen", default=os.environ.get("EDGE_LISTEN", "0.0.0.0:8000"))
        parser.add_argument(
            "--web",
            action="append",
            default=None,
            help="a web process behind the edge (host:port or unix:/path); repeatable",
        )
        parser.add_argument("--workers", default=os.environ.get("EDGE_WORKERS", "auto"))
        parser.add_argument("--access-log", action="store_true")
        parser.add_argument("--render-only", action="store_true")

    def handle(self, *args, **opts) -> None:  # noqa: ANN002, ANN003
        web = opts["web"] or [
            s.strip() for s in os.environ.get("EDGE_WEB", "127.0.0.1:8001").split(",") if s
        ]
        try:
            options = edge.options(
                opts["listen"],
                tuple(web),
                workers=opts["workers"],
                access_log=opts["access_log"],
            )
            conf = edge.write(options)
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        if opts["render_only"]:
            self.stdout.write(str(conf))
            return
        if not shutil.which(edge.NGINX):
            raise CommandError(f"{edge.NGINX} is missing: apt-get install nginx (make system-deps)")
        argv = edge.command(conf, options.prefix)
        test = subprocess.run([*argv, "-t", "-q"], capture_output=True, text=True, check=False)  # noqa: S603
        if test.returncode != 0:
            raise CommandError(f"nginx refused {conf}: {test.stderr.strip()[-2000:]}")
        os.execv(argv[0], argv)  # noqa: S606 - nginx by absolute path, our own argv
