"""Teams (issue 30): a team owns instances, allocations, disks, /pfs usage and the GPU quota; the
member who made a row is kept as ``created_by``. Every row's team is its owner's personal team."""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


def fill_teams(apps, schema_editor):
    Team = apps.get_model("console", "Team")
    teams = dict(Team.objects.filter(personal_of__isnull=False).values_list("personal_of_id", "pk"))
    for name in ("Instance", "Allocation", "Disk"):
        model = apps.get_model("slices", name)
        for user_id in model.objects.values_list("created_by_id", flat=True).distinct():
            model.objects.filter(created_by_id=user_id).update(team_id=teams[user_id])
    for name in ("GpuQuota", "PfsUsage"):
        model = apps.get_model("slices", name)
        for row in model.objects.all():
            row.team_id = teams[row.owner_id]
            row.save(update_fields=["team"])


def team_fk(related_name, null=False):
    return models.ForeignKey(
        null=null, on_delete=django.db.models.deletion.PROTECT, related_name=related_name, to="console.team"
    )


def team_one(related_name, null=False):
    return models.OneToOneField(
        null=null, on_delete=django.db.models.deletion.CASCADE, related_name=related_name, to="console.team"
    )


class Migration(migrations.Migration):
    dependencies = [
        ("console", "0006_teams"),
        ("slices", "0011_gateway_ports"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.RemoveConstraint(model_name="instance", name="slices_instance_idempotency_key"),
        migrations.RenameField(model_name="instance", old_name="owner", new_name="created_by"),
        migrations.RenameField(model_name="allocation", old_name="owner", new_name="created_by"),
        migrations.RenameField(model_name="disk", old_name="owner", new_name="created_by"),
        migrations.AddField(model_name="instance", name="team", field=team_fk("instances", null=True)),
        migrations.AddField(model_name="allocation", name="team", field=team_fk("gpu_allocations", null=True)),
        migrations.AddField(model_name="disk", name="team", field=team_fk("disks", null=True)),
        migrations.AddField(model_name="gpuquota", name="team", field=team_one("gpu_quota", null=True)),
        migrations.AddField(model_name="pfsusage", name="team", field=team_one("pfs_usage", null=True)),
        migrations.RunPython(fill_teams, migrations.RunPython.noop),
        migrations.RemoveField(model_name="gpuquota", name="owner"),
        migrations.RemoveField(model_name="pfsusage", name="owner"),
        migrations.AlterField(model_name="instance", name="team", field=team_fk("instances")),
        migrations.AlterField(model_name="allocation", name="team", field=team_fk("gpu_allocations")),
        migrations.AlterField(model_name="disk", name="team", field=team_fk("disks")),
        migrations.AlterField(model_name="gpuquota", name="team", field=team_one("gpu_quota")),
        migrations.AlterField(model_name="pfsusage", name="team", field=team_one("pfs_usage")),
        migrations.AddConstraint(
            model_name="instance",
            constraint=models.UniqueConstraint(fields=("team", "idempotency_key"), name="slices_instance_idempotency_key"),
        ),
    ]
