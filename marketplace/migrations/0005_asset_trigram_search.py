"""Search by substring on both databases (see querysets.py): on PostgreSQL a pg_trgm GIN index
serves ``search_document LIKE '%term%'`` for English and Chinese terms alike, replacing the
full-text index of 0002 (whose 'simple' parser cannot cut Chinese into words). Every asset's
search document is rebuilt with the new tokenizer, which keeps Chinese text.
"""

from django.contrib.postgres.operations import TrigramExtension
from django.db import migrations

from marketplace.catalogue import search_document

INDEX = "marketplace_asset_search_trgm"
OLD_INDEX = "marketplace_asset_search_gin"


def create_index(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"DROP INDEX IF EXISTS {OLD_INDEX}")
        schema_editor.execute(
            f"CREATE INDEX IF NOT EXISTS {INDEX} ON marketplace_asset "
            "USING gin (search_document gin_trgm_ops)"
        )


def drop_index(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"DROP INDEX IF EXISTS {INDEX}")
        schema_editor.execute(
            f"CREATE INDEX IF NOT EXISTS {OLD_INDEX} ON marketplace_asset "
            "USING gin (to_tsvector('simple'::regconfig, search_document))"
        )


def rebuild_documents(apps, schema_editor):
    # The same fields as Asset.build_search_document (a historical model has no methods).
    Asset = apps.get_model("marketplace", "Asset")
    changed = []
    for asset in Asset.objects.all():
        names = [
            asset.hub_id,
            asset.name,
            asset.name_zh,
            asset.publisher,
            asset.tasks or asset.task,
            asset.modalities,
        ]
        document = search_document(names, [asset.description, asset.description_zh])
        if document != asset.search_document:
            asset.search_document = document
            changed.append(asset)
    Asset.objects.bulk_update(changed, ["search_document"], batch_size=500)


class Migration(migrations.Migration):
    dependencies = [("marketplace", "0004_asset_chinese_names_likes")]

    operations = [
        # A no-op on SQLite. On PostgreSQL 13+ pg_trgm is a trusted extension: the database
        # owner may create it without being a superuser.
        TrigramExtension(),
        migrations.RunPython(create_index, drop_index, elidable=False),
        migrations.RunPython(rebuild_documents, migrations.RunPython.noop, elidable=False),
    ]
