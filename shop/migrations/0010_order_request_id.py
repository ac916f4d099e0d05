# Orders carry the id of the checkout request that placed it: on MySQL, which has no
# INSERT ... RETURNING, the batch writer reads its orders' ids back by these.

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('shop', '0009_order_refunded'),
    ]

    operations = [
        migrations.AddField(
            model_name='order',
            name='request_id',
            field=models.CharField(blank=True, editable=False, max_length=32, null=True, unique=True),
        ),
    ]
