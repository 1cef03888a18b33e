"""What survives a restart: each job's configuration and current round, and every closed round.

The live decision state (every worker's k, c, seen, ready) lives in memory (``esync.policy``);
these rows let a restarted server rebuild a job and let anyone inspect a finished one.
"""
from django.db import models


class Job(models.Model):
    """One training job; ``init`` creates it or starts a new ``run`` of it."""

    POLICY_CHOICES = [("dynamic", "dynamic"), ("planned", "planned")]

    name = models.CharField(max_length=64, unique=True)
    num_workers = models.PositiveIntegerField()
    epsilon = models.CharField(max_length=32, help_text="'auto' or absolute seconds")
    policy = models.CharField(max_length=16, choices=POLICY_CHOICES)
    current_round = models.PositiveIntegerField(default=1)
    run = models.PositiveIntegerField(default=1, help_text="incremented by every init")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"{self.name} (run {self.run}, round {self.current_round})"


class WorkerRound(models.Model):
    """One worker's closed round: iterations, last duration, compute and waiting time (seconds)."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="worker_rounds")
    run = models.PositiveIntegerField()
    round = models.PositiveIntegerField()
    rank = models.PositiveIntegerField()
    k = models.PositiveIntegerField()
    c = models.FloatField()
    compute = models.FloatField()
    wait = models.FloatField()
    recorded_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["job", "run", "round", "rank"],
                                               name="one_record_per_worker_round")]
        ordering = ["job", "run", "round", "rank"]

    def __str__(self) -> str:
        return f"{self.job_id}/{self.run} round {self.round} rank {self.rank}"
