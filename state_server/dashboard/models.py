"""What the dashboard shows that the coordination itself does not need: where each worker runs
and how slow its (emulated) device is (told by the worker at start and on each speed change) and the evaluator's test accuracy per scored checkpoint.

Both live in the database so that a restarted state server still shows them.
"""
from django.db import models

from coordination.models import Job


class WorkerInfo(models.Model):
    """Host, device and slow-down factor of one rank of a job, from the worker's ``hello`` (the
    latest one wins)."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="worker_infos")
    rank = models.PositiveIntegerField()
    host = models.CharField(max_length=64)
    device = models.CharField(max_length=64)
    # Null: the worker did not say (an older worker); 1 = full speed, 6 = six times slower.
    slowdown = models.FloatField(null=True, blank=True,
                                 help_text="the device's slow-down factor in force (>= 1)")
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["job", "rank"], name="one_info_per_rank")]
        ordering = ["job", "rank"]

    def __str__(self) -> str:
        return f"{self.job_id} rank {self.rank}: {self.device} on {self.host}"


class Score(models.Model):
    """Test accuracy of the checkpoint of ``round`` of one run, after ``time`` s of training."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="scores")
    run = models.PositiveIntegerField()
    round = models.PositiveIntegerField()
    time = models.FloatField(help_text="training seconds when the checkpoint was taken")
    accuracy = models.FloatField()
    recorded_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["job", "run", "round"],
                                               name="one_score_per_round")]
        ordering = ["job", "run", "round"]

    def __str__(self) -> str:
        return f"{self.job_id}/{self.run} round {self.round}: {self.accuracy:.4f}"
