# The settlement in SQL (issue 21): each run updates every open session and inserts one usage
# charge per session, so the session table keeps room for a second version of every row on its page
# (HOT updates, no index writes) and usage charges lose their index on session alone (the unique
# (session, from_second) index serves those lookups).

import django.db.models.deletion
from django.db import migrations, models


def set_fillfactor(apps, schema_editor):
    # A settlement rewrites every row of a page at once: with 70 % filled only ~40 % of the new
    # versions fit beside the old ones; at 45 % all do, and the next run prunes the dead ones.
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("ALTER TABLE billing_usagesession SET (fillfactor = 45)")


def reset_fillfactor(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("ALTER TABLE billing_usagesession SET (fillfactor = 70)")


class Migration(migrations.Migration):
    dependencies = [
        ("billing", "0005_memo_code"),
    ]

    operations = [
        migrations.AlterField(
            model_name="usagecharge",
            name="session",
            field=models.ForeignKey(
                db_index=False,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="charges",
                to="billing.usagesession",
            ),
        ),
        migrations.RunPython(set_fillfactor, reset_fillfactor),
    ]
