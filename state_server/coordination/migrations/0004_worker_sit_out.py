from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('coordination', '0003_round_sizing'),
    ]

    operations = [
        migrations.AddField(
            model_name='workerstate',
            name='sit_out_from',
            field=models.PositiveIntegerField(default=0, help_text='the round from which the worker sits out (0: it takes part)'),
        ),
    ]
