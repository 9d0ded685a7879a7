"""Search understands task words and sizes (catalogue.parse_query): every asset's search document
is rebuilt with the marks the query parser asks for (sizes and numbers cut on number boundaries,
the task and modality facets, the Chinese mark). Derived data only; no schema change."""

from django.db import migrations

from marketplace.catalogue import asset_search_document


def _unpack(value: str, sep: str) -> list[str]:
    return [v for v in (value or "").split(sep) if v]


def rebuild_documents(apps, schema_editor):
    # The same fields as Asset.build_search_document (a historical model has no methods).
    Asset = apps.get_model("marketplace", "Asset")
    changed = []
    for asset in Asset.objects.all():
        document = asset_search_document(
            hub_id=asset.hub_id,
            name=asset.name,
            name_zh=asset.name_zh,
            publisher=asset.publisher,
            tasks=_unpack(asset.tasks, ";") or ([asset.task] if asset.task else []),
            modalities=_unpack(asset.modalities, ","),
            description=asset.description,
            description_zh=asset.description_zh,
        )
        if document != asset.search_document:
            asset.search_document = document
            changed.append(asset)
    Asset.objects.bulk_update(changed, ["search_document"], batch_size=500)


class Migration(migrations.Migration):
    dependencies = [("marketplace", "0005_asset_trigram_search")]

    operations = [
        migrations.RunPython(rebuild_documents, migrations.RunPython.noop, elidable=False),
    ]
