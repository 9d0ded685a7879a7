"""Teams (issue 30): the wallet is the team's (each wallet goes to its owner's personal team)."""

import django.db.models.deletion
from django.db import migrations, models


def fill_teams(apps, schema_editor):
    Team = apps.get_model("console", "Team")
    Wallet = apps.get_model("billing", "Wallet")
    teams = dict(Team.objects.filter(personal_of__isnull=False).values_list("personal_of_id", "pk"))
    for wallet in Wallet.objects.all():
        wallet.team_id = teams[wallet.owner_id]
        wallet.save(update_fields=["team"])


class Migration(migrations.Migration):
    dependencies = [
        ("console", "0006_teams"),
        ("billing", "0009_bill_regions"),
    ]

    operations = [
        migrations.AddField(
            model_name="wallet",
            name="team",
            field=models.OneToOneField(null=True, on_delete=django.db.models.deletion.PROTECT, related_name="wallet", to="console.team"),
        ),
        migrations.RunPython(fill_teams, migrations.RunPython.noop),
        migrations.RemoveField(model_name="wallet", name="owner"),
        migrations.AlterField(
            model_name="wallet",
            name="team",
            field=models.OneToOneField(on_delete=django.db.models.deletion.PROTECT, related_name="wallet", to="console.team"),
        ),
    ]
