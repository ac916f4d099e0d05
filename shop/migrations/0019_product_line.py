from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('shop', '0018_outboxmail_order_reserved'),
    ]

    operations = [
        migrations.AddField(
            model_name='product',
            name='line_started_at',
            field=models.DateTimeField(blank=True, editable=False, null=True),
        ),
        migrations.AddField(
            model_name='product',
            name='line_order',
            field=models.CharField(choices=[('shuffle', 'Shuffle at the opening'), ('fifo', 'Arrival order')], default='shuffle', help_text='How the pre-queue is put in line at the opening: shuffled (the default) or in arrival order.', max_length=8, verbose_name='pre-queue order'),
        ),
        migrations.AddField(
            model_name='product',
            name='line_paused',
            field=models.BooleanField(default=False, help_text="Let nobody new from the drop's line to the checkout (buyers keep their places).", verbose_name='line paused'),
        ),
        migrations.AddField(
            model_name='product',
            name='line_prequeue_seconds',
            field=models.PositiveIntegerField(default=0, help_text='Buyers who come this many seconds before the drop opens join its line early. 0: no pre-queue.', verbose_name='pre-queue (seconds)'),
        ),
    ]
