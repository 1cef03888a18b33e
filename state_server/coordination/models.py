"""What survives a restart: each job's configuration, every worker's round and state, every
closed round and every round report.

The live decision state lives in memory (``esync.coordination.job``); these rows let a restarted server
rebuild a job (``WorkerState`` per rank, the last ``RoundReport``) and let anyone inspect a
finished one (``WorkerRound``).
"""
from django.db import models


class Job(models.Model):
    """One training job; ``init`` creates it or starts a new ``run`` of it."""

    POLICY_CHOICES = [("dynamic", "dynamic"), ("planned", "planned")]

    name = models.CharField(max_length=64, unique=True)
    num_workers = models.PositiveIntegerField()
    epsilon = models.CharField(max_length=32, help_text="'auto' or absolute seconds")
    policy = models.CharField(max_length=16, choices=POLICY_CHOICES)
    sizing = models.JSONField(default=dict, blank=True,
                              help_text="round sizing: comm_share, max_round, overlap "
                                        "(empty: rounds sized by compute alone)")
    current_round = models.PositiveIntegerField(default=1)
    run = models.PositiveIntegerField(default=1, help_text="incremented by every init")
    init_key = models.CharField(max_length=64, blank=True, default="",
                                help_text="client key of the init that started this run (a "
                                          "retried init with the same key starts no new run)")
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


class WorkerState(models.Model):
    """One worker's persistent decision state in the job's current run (one row per rank).

    Written before a round change is acknowledged, so a restarted server rebuilds every worker's
    round, last duration, planned k and the accounting of its open round.
    """

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="worker_states")
    run = models.PositiveIntegerField()
    rank = models.PositiveIntegerField()
    round = models.PositiveIntegerField()
    k = models.PositiveIntegerField(default=0)
    c = models.FloatField(default=0.0)
    ready = models.BooleanField(default=False)
    planned_k = models.PositiveIntegerField(null=True)
    overhead = models.FloatField(null=True)
    round_k = models.PositiveIntegerField(default=0)
    round_compute = models.FloatField(default=0.0)
    sit_out_from = models.PositiveIntegerField(
        default=0, help_text="the round from which the worker sits out (0: it takes part)")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["job", "rank"],
                                               name="one_state_per_worker")]

    def __str__(self) -> str:
        return f"{self.job_id}/{self.run} rank {self.rank} round {self.round}"


class RoundReport(models.Model):
    """A round reported by rank 0 on ``/rounds/`` and the plan answered (idempotent replies)."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="round_reports")
    run = models.PositiveIntegerField()
    round = models.PositiveIntegerField()
    plan = models.JSONField()
    recorded_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["job", "run", "round"],
                                               name="one_report_per_round")]

    def __str__(self) -> str:
        return f"{self.job_id}/{self.run} round {self.round} reported"
