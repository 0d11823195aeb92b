from django.db import models


class Order(models.Model):
    item = models.CharField(max_length=100)
    status = models.CharField(max_length=20, default="new")
    details = models.JSONField(default=dict)
    charged_at = models.DateTimeField(null=True)

    class Meta:
        app_label = "django_testapp"
        db_table = "django_orders"


class Run(models.Model):
    """One row per handler run, in the order they ran (serial id)."""

    label = models.CharField(max_length=100)

    class Meta:
        app_label = "django_testapp"
        db_table = "django_runs"
