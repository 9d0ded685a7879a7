from __future__ import annotations

import factory

from console.models import User


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = User

    username = factory.Sequence(lambda n: f"customer{n}")
    email = factory.LazyAttribute(lambda u: f"{u.username}@example.com")
