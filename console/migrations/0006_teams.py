"""Teams (issue 30): every account gets a personal team that owns what the account owned.

The personal team's /pfs key is the account's public id, so no directory moves on a node.
"""

import uuid

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


def personal_teams(apps, schema_editor):
    User = apps.get_model("console", "User")
    Team = apps.get_model("console", "Team")
    Membership = apps.get_model("console", "Membership")
    ApiToken = apps.get_model("console", "ApiToken")
    for user in User.objects.all().iterator():
        team, _ = Team.objects.get_or_create(
            personal_of=user,
            defaults={"name": user.username, "pfs_key": str(user.public_id)},
        )
        Membership.objects.get_or_create(team=team, user=user, defaults={"role": "owner"})
        ApiToken.objects.filter(owner=user, team__isnull=True).update(team=team)


class Migration(migrations.Migration):
    dependencies = [
        ("console", "0005_verification_notices"),
    ]

    operations = [
        migrations.CreateModel(
            name="Team",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("public_id", models.UUIDField(default=uuid.uuid4, editable=False, unique=True)),
                ("name", models.CharField(max_length=100, verbose_name="name")),
                ("pfs_key", models.CharField(editable=False, max_length=64, unique=True)),
                ("created_at", models.DateTimeField(auto_now_add=True)),
                (
                    "personal_of",
                    models.OneToOneField(
                        blank=True,
                        null=True,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="personal_team",
                        to=settings.AUTH_USER_MODEL,
                    ),
                ),
            ],
            options={"verbose_name": "team", "verbose_name_plural": "teams", "ordering": ("name", "id")},
        ),
        migrations.CreateModel(
            name="Membership",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                (
                    "role",
                    models.CharField(
                        choices=[
                            ("owner", "Owner"),
                            ("admin", "Admin"),
                            ("billing", "Billing"),
                            ("developer", "Developer"),
                            ("viewer", "Viewer"),
                        ],
                        max_length=12,
                        verbose_name="role",
                    ),
                ),
                ("budget_monthly", models.DecimalField(blank=True, decimal_places=2, max_digits=12, null=True, verbose_name="monthly budget (元)")),
                ("gpu_quota", models.PositiveIntegerField(blank=True, null=True, verbose_name="card quota")),
                ("stop_on_budget", models.BooleanField(default=False, verbose_name="stop on exhaustion")),
                ("created_at", models.DateTimeField(auto_now_add=True)),
                ("team", models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name="memberships", to="console.team")),
                ("user", models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name="memberships", to=settings.AUTH_USER_MODEL)),
            ],
            options={
                "verbose_name": "membership",
                "verbose_name_plural": "memberships",
                "ordering": ("team", "created_at", "id"),
                "constraints": [models.UniqueConstraint(fields=("team", "user"), name="console_membership_once")],
            },
        ),
        migrations.AddField(
            model_name="apitoken",
            name="team",
            field=models.ForeignKey(null=True, on_delete=django.db.models.deletion.CASCADE, related_name="api_tokens", to="console.team"),
        ),
        migrations.RunPython(personal_teams, migrations.RunPython.noop),
        migrations.AlterField(
            model_name="apitoken",
            name="team",
            field=models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name="api_tokens", to="console.team"),
        ),
    ]
