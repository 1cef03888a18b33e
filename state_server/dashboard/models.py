"""What the dashboard shows that the coordination itself does not need: where each worker runs
(told once by the worker at start) and the evaluator's test accuracy per scored checkpoint.

Both live in the database so that a restarted state server still shows them.
"""
from django.db import models

from coordination.models import Job


class WorkerInfo(models.Model):
    """Host and device of one rank of a job, from the worker's ``hello`` (the latest one wins)."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="worker_infos")
    rank = models.PositiveIntegerField()
    host = models.CharField(max_length=64)
    device = models.CharField(max_length=64)
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
