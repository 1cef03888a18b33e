"""Where each test score goes besides ``evaluations.jsonl``: TensorBoard and the live dashboard.

The evaluator (and the standalone trainer, which scores in-process) hands every score to one
``ScoreReport``. It writes TensorBoard scalars when ``--tensorboard DIR`` is set, and posts the
score to the state server's ``/jobs/<job>/scores/`` when the job has a state server (ESync mode
asking it for k) and a token (``$ESYNC_STATE_TOKEN``, as the workers get it). The dashboard is a
view, not part of training: a state server that refuses or does not answer costs a warning line,
never the evaluation.
"""
from __future__ import annotations

from esync.worker.tboard import EvaluationScalars

POST_RETRY_SECONDS = 10.0       # a restarting state server is back within this; then give up


class ScoreReport:
    def __init__(self, args, *, prefix: str = "[evaluator]"):
        self.prefix = prefix
        self.scalars = EvaluationScalars(args.tensorboard) if args.tensorboard else None
        self.client = None
        if args.mode == "esync" and not args.local_iters:
            if args.state_token:
                from esync.coordination.client import StateClient
                self.client = StateClient(f"http://{args.state_server_ip}:{args.state_server_port}",
                                          job=args.job, token=args.state_token,
                                          retry_for=POST_RETRY_SECONDS)
            else:
                print(f"{prefix} scores are not sent to the state server's dashboard: no token "
                      "(set ESYNC_STATE_TOKEN)", flush=True)

    def add(self, round_no: int, *, training_seconds: float, accuracy: float) -> None:
        if self.scalars is not None:
            self.scalars.add_score(round_no, training_seconds=training_seconds, accuracy=accuracy)
        if self.client is not None:
            from esync.coordination.client import StateServerError
            try:
                self.client.score(round_no, time=training_seconds, accuracy=accuracy)
            except StateServerError as exc:
                print(f"{self.prefix} warning: the dashboard did not get round {round_no}'s "
                      f"score: {exc}", flush=True)

    def close(self) -> None:
        if self.scalars is not None:
            self.scalars.close()
        if self.client is not None:
            self.client.close()
