from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True
    dependencies = [("skiplock", "0001_skiplock_schema")]
    operations = [
        migrations.CreateModel(
            name="Order",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("item", models.CharField(max_length=100)),
                ("status", models.CharField(default="new", max_length=20)),
                ("charged_at", models.DateTimeField(null=True)),
            ],
            options={"db_table": "shop_orders"},
        ),
        migrations.CreateModel(
            name="Email",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("text", models.TextField()),
                ("order", models.ForeignKey(on_delete=models.deletion.CASCADE, to="shop.order")),
            ],
            options={"db_table": "shop_emails"},
        ),
    ]
