from django.db import models


class Order(models.Model):
    item = models.CharField(max_length=100)
    status = models.CharField(max_length=20, default="new")
    charged_at = models.DateTimeField(null=True)

    class Meta:
        db_table = "shop_orders"


class Email(models.Model):
    order = models.ForeignKey(Order, on_delete=models.CASCADE)
    text = models.TextField()

    class Meta:
        db_table = "shop_emails"
