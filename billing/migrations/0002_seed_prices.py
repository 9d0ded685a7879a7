from django.db import migrations


def forwards(apps, schema_editor):
    from billing.seed import seed_billing

    seed_billing(
        apps.get_model("billing", "PriceBook"),
        apps.get_model("billing", "GpuPrice"),
        apps.get_model("billing", "TermPrice"),
        apps.get_model("billing", "TopUpBonusRule"),
    )


class Migration(migrations.Migration):
    dependencies = [("billing", "0001_initial")]
    operations = [migrations.RunPython(forwards, migrations.RunPython.noop)]
