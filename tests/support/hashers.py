"""The in-process suite's password hasher: Django's PBKDF2 with one iteration.

Production hashes with PBKDF2-SHA256 at Django's 1,000,000 iterations (about 0.25 s of CPU a
hash, by design); the suite creates a user with a password, or logs one in, over a thousand times,
which at that cost was minutes of CPU. The algorithm, the stored format (``pbkdf2_sha256$...``)
and every check are the same; only the work factor is lowered, and only in the test process
(tests/conftest.py). The servers the suite starts as processes keep the real settings.
"""

from __future__ import annotations

from django.contrib.auth.hashers import PBKDF2PasswordHasher


class OneIterationPBKDF2PasswordHasher(PBKDF2PasswordHasher):
    iterations = 1
