"""Production's telemetry relay process: samples every running instance's GPUs once a second and
relays them (channel layer, Redis ring, minute rollups). One per deployment (the Procfile's
``telemetry``); the embedded default runs the same loop as a thread of the web process."""

from __future__ import annotations

import signal
import threading
from typing import Any

from django.core.management.base import BaseCommand

from slices.telemetry.relay import Relay


class Command(BaseCommand):
    help = "Relay live GPU telemetry of every running instance (runs until SIGTERM/SIGINT)."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--interval", type=float, default=None, help="seconds between ticks")

    def handle(self, *args: Any, **options: Any) -> None:
        stop = threading.Event()

        def on_signal(signum: int, frame: Any) -> None:
            stop.set()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        self.stdout.write("telemetry relay running")
        Relay().run(stop, interval=options["interval"])
        self.stdout.write("telemetry relay stopped (the unfinished minute was written)")
