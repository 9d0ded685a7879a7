"""Viewset bases for every app's API: objects in URLs carry their ``public_id``, never the
sequential key, and the router matches it with the one UUID pattern (console/ids.py).

The bases carry no docstrings: drf-spectacular would print them as every endpoint's description.
"""

from __future__ import annotations

from rest_framework import mixins, viewsets

from console.ids import UUID_PATTERN


# Detail routes as /<resource>/<public_id>/; each subclass's get_queryset scopes to the caller.
class PublicIdViewSet(viewsets.GenericViewSet):
    lookup_field = "public_id"
    lookup_value_regex = UUID_PATTERN


# The list and one object by public_id.
class ListRetrieveViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, PublicIdViewSet):
    pass
