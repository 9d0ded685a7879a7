"""SSH keys in their canonical encoding, one account per key (issue 29).

Stored keys are re-encoded as ``console.sshkeys`` now stores them (an RSA modulus padded with zero
bytes becomes its minimal encoding) and their fingerprints recomputed. Two rows that turn out to be
one key keep the older: a later row of the same account was a duplicate, a later row of another
account was a key already in use (what the console refuses now). An account that lost its default
key that way gets its newest remaining one as default. Then the fingerprint is unique across
accounts.
"""

from django.db import migrations, models


def canonicalise(apps, schema_editor):  # noqa: ANN001, ANN201
    from console.sshkeys import SshKeyError, parse_public_key

    SshKey = apps.get_model("console", "SshKey")
    seen: set[str] = set()
    lost_default: set[int] = set()
    updates = []
    for row in SshKey.objects.order_by("created_at", "id").iterator():
        try:
            key = parse_public_key(row.public_key)
        except SshKeyError:
            continue  # never stored by the parser; left as it is
        if key.fingerprint in seen:
            if row.is_default:
                lost_default.add(row.owner_id)
            row.delete()
            continue
        seen.add(key.fingerprint)
        if (row.public_key, row.fingerprint, row.bits) != (key.openssh, key.fingerprint, key.bits):
            updates.append((row.pk, key))
    # Written once every later duplicate is gone: no row ever holds another's fingerprint.
    for pk, key in updates:
        SshKey.objects.filter(pk=pk).update(
            public_key=key.openssh, fingerprint=key.fingerprint, bits=key.bits
        )
    for owner_id in lost_default:
        mine = SshKey.objects.filter(owner_id=owner_id)
        if not mine.filter(is_default=True).exists():
            newest = mine.order_by("-created_at", "-id").first()
            if newest is not None:
                mine.filter(pk=newest.pk).update(is_default=True)


class Migration(migrations.Migration):
    dependencies = [
        ("console", "0003_trialcreditclaim"),
    ]

    operations = [
        migrations.RemoveConstraint(
            model_name="sshkey",
            name="console_sshkey_unique_fingerprint",
        ),
        migrations.RunPython(canonicalise, migrations.RunPython.noop),
        migrations.AddConstraint(
            model_name="sshkey",
            constraint=models.UniqueConstraint(
                fields=("fingerprint",), name="console_sshkey_one_account"
            ),
        ),
    ]
