"""Issue 30: every usage session and long-term rental records the member who caused it.

Rows written before teams belong to personal teams: their member is the team's person. (A team's
shared storage session keeps no member.)
"""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


def fill_members(apps, schema_editor):
    Team = apps.get_model("console", "Team")
    UsageSession = apps.get_model("billing", "UsageSession")
    TermRental = apps.get_model("billing", "TermRental")
    person = models.Subquery(
        Team.objects.filter(wallet=models.OuterRef("wallet_id")).values("personal_of_id")[:1]
    )
    for model in (UsageSession, TermRental):
        model.objects.filter(member__isnull=True, wallet__team__personal_of__isnull=False).update(
            member_id=person
        )


class Migration(migrations.Migration):

    dependencies = [
        ('billing', '0010_teams'),
        ("console", "0006_teams"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AddField(
            model_name='termrental',
            name='member',
            field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to=settings.AUTH_USER_MODEL, verbose_name='member'),
        ),
        migrations.AddField(
            model_name='usagesession',
            name='member',
            field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to=settings.AUTH_USER_MODEL, verbose_name='member'),
        ),
        migrations.AlterField(
            model_name='usagesession',
            name='close_reason',
            field=models.CharField(blank=True, choices=[('released', 'Released'), ('failed', 'Failed'), ('migrated', 'Migrated away'), ('insufficient_funds', 'Stopped: balance exhausted'), ('term_covered', 'Covered by a long-term rental'), ('budget_exhausted', "Stopped: the member's monthly budget is spent")], max_length=20),
        ),
        migrations.RunPython(fill_members, migrations.RunPython.noop),
    ]
