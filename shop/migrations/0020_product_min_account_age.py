from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("shop", "0019_product_line"),
    ]

    operations = [
        migrations.AddField(
            model_name="product",
            name="min_account_age",
            field=models.DurationField(blank=True, help_text="Only accounts at least this old may buy this product, e.g. 7d, 24h, 90m. Empty: any account.", null=True, verbose_name="min account age"),
        ),
    ]
