"""Full-text search index on PostgreSQL (SQLite searches without an index: see querysets.py).

(Replaced by the trigram index of 0005.)
"""

from django.db import migrations

INDEX = "marketplace_asset_search_gin"


def create_index(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(
            f"CREATE INDEX IF NOT EXISTS {INDEX} ON marketplace_asset "
            "USING gin (to_tsvector('simple'::regconfig, search_document))"
        )


def drop_index(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"DROP INDEX IF EXISTS {INDEX}")


class Migration(migrations.Migration):
    dependencies = [("marketplace", "0001_initial")]

    operations = [migrations.RunPython(create_index, drop_index, elidable=False)]
