"""Installs (or upgrades) skiplock's own schema, as ``skiplock migrate`` does: skiplock's versioned,
advisory-locked migrations, on the settings' database (DATABASE) and schema (SCHEMA). Reversing it
leaves the schema in place (drop it by hand: ``DROP SCHEMA skiplock CASCADE``)."""

from django.db import migrations


def install(apps, schema_editor):  # noqa: ARG001 - Django's signature
    from skiplock.contrib.django.runtime import app_for, options

    opts = options()
    if schema_editor.connection.alias == opts["DATABASE"]:
        app_for(opts["DATABASE"], opts["SCHEMA"]).migrate()


class Migration(migrations.Migration):
    atomic = False  # skiplock's migrations run on a connection of their own, under their own lock
    dependencies: list = []
    operations = [migrations.RunPython(install, migrations.RunPython.noop)]
