"""The ESync algorithm, composed of its parts (the package's docstring says which and why).

``prepare`` picks one of each part by the flags, through the declarations of
``esync.common.esync_parts`` (the one table that also checks which choices combine); the hooks of
``esync.worker.algorithms.base.Algorithm`` hand each call to the part it concerns.
"""
from __future__ import annotations

from esync.common import esync_parts
from esync.worker.algorithms.base import Algorithm, datas
from esync.worker.algorithms.esync.exchange import RoundExchange
from esync.worker.algorithms.esync.local_rule import Accumulated, LocalSGD
from esync.worker.algorithms.esync.outer import OuterStep
from esync.worker.algorithms.esync.scaffold import ControlVariates
from esync.worker.algorithms.esync.schedule import Blocking, Carrying, Overlapped
from esync.worker.algorithms.esync.sizing import DynamicRounds, FixedRounds, PlannedRounds
from esync.worker.algorithms.esync.wire import FactoredDeltas, FullDeltas

# Each part's classes by the option whose choice runs it (``esync_parts.chosen``; None: the
# part's default). --carry-slowest without --carry carries nothing.
ROUND_SIZINGS = {None: DynamicRounds, "policy": PlannedRounds, "local_iters": FixedRounds}
SCHEDULES = {None: Blocking, "overlap": Overlapped, "carry": Carrying, "carry_slowest": Blocking}
WIRES = {None: FullDeltas, "comm_dtype": FullDeltas, "low_rank": FactoredDeltas}
LOCAL_RULES = {None: LocalSGD, "prox_mu": LocalSGD, "scaffold": LocalSGD,
               "accumulate": Accumulated}


class ESync(Algorithm):
    kvstore_type = "dist_sync"
    collective_stop = True

    def prepare(self) -> None:
        """The parts, before the KVStore keys exist (the state server's job is created here)."""
        cfg, w = self.config, self.worker
        shapes = [p.shape for p in w.trainable]
        schedule = SCHEDULES[esync_parts.chosen("schedule", cfg)]
        self.outer = OuterStep(cfg, shapes, w.ctx)
        self.wire = self._wire(shapes, schedule.exchange_outlives_round)
        self.local = self._local_rule(shapes)
        self.rounds = ROUND_SIZINGS[esync_parts.chosen("round sizing", cfg)](cfg, w)
        self.exchange = RoundExchange(self, wire=self.wire, local=self.local, outer=self.outer,
                                      rounds=self.rounds,
                                      outlives_round=schedule.exchange_outlives_round)
        self.schedule = schedule(self, self.exchange)

    def _wire(self, shapes, outlives_round: bool):
        cfg = self.config
        wire = WIRES[esync_parts.chosen("wire", cfg)]
        if wire is FactoredDeltas:
            return wire(shapes, cfg.comm_dtype, rank=cfg.low_rank, ctx=self.worker.ctx,
                        reads_deltas_after_push=outlives_round)
        return wire(shapes, cfg.comm_dtype, reads_deltas_after_push=outlives_round)

    def _local_rule(self, shapes):
        cfg = self.config
        rule = LOCAL_RULES[esync_parts.chosen("local rule", cfg)]
        if rule is Accumulated:
            return rule(self)
        variates = (ControlVariates(shapes, self.worker.ctx, aggregation=cfg.aggregation,
                                    local_lr=cfg.local_lr)
                    if esync_parts.is_on("scaffold", cfg) else None)
        return rule(self, variates=variates)

    def state_arrays(self) -> dict:
        """The outer optimizer's buffers and SCAFFOLD's global variate: checkpointed, and rank
        0's reach every worker on start."""
        return {**self.outer.state_arrays(), **self.local.state_arrays()}

    def saved_state(self) -> dict:
        return {**self.outer.saved_state(),
                **{name: a.asnumpy() for name, a in self.local.state_arrays().items()}}

    def extra_keys(self) -> list:
        """The keys besides the model's, one per array each, in this order: the wire's for the
        deltas (float16), the local rule's (SCAFFOLD's variates), the wire's factors."""
        return (self.wire.delta_key_shapes() + self.local.key_shapes()
                + self.wire.factor_key_shapes())

    def setup(self) -> None:
        w = self.worker
        weights = datas(w.trainable)
        self.local.setup(weights)
        self.exchange.setup(weights)
        extra = w.keys.extra
        deltas, own = len(self.wire.delta_key_shapes()), len(self.local.key_shapes())
        self.wire.setup(weights, model_keys=w.keys.trainable, delta_keys=extra[:deltas],
                        factor_keys=extra[deltas + own:])
        self.local.use_keys(extra[deltas:deltas + own])
        self.outer.setup()

    def announce(self, *, host: str, device: str, slowdown: float | None = None) -> None:
        self.rounds.announce(host=host, device=device, slowdown=slowdown)

    def speed_changed(self, slowdown: float) -> None:
        self.rounds.speed_changed(slowdown)

    def continue_local(self, k: int, last_c: float, record) -> bool:
        return self.rounds.continue_local(k, self.exchange.carried_in, last_c, record)

    @property
    def sitting_out(self) -> bool:
        return self.rounds.sitting_out

    def local_step(self, record) -> None:
        with record.phase("local update"):
            self.local.step(self.worker.trainable, self.exchange.round_start,
                            self.worker.batch_samples)

    def aggregate(self, record, want_stop: bool) -> bool:
        with self.exchange.overhead_measured():
            return self.schedule.aggregate(record, want_stop)

    def round_extras(self) -> dict:
        """The last finished exchange's duration (push to the last sum: hidden under
        --overlap when shorter than the round), its waits, the iterations carried into this
        round, and the round sizing's own (``RoundSizer.extras``)."""
        ex = self.exchange
        return {"exchange_time": round(ex.last_comm or 0.0, 6),
                "carried_iterations": ex.carried_in,
                "exchange_wait": round(ex.round_waited, 6),
                "aggregation_overhead": round(ex.last_overhead, 6),
                **self.rounds.extras()}

    def global_model(self) -> dict:
        """With overlap a worker trains on g + its own delta, with --carry on g + its carried
        iterations; the shared model is g."""
        if not self.schedule.global_model_differs:
            return {}
        return {id(p): g for p, g in zip(self.worker.trainable, self.exchange.start)}

    def state_requests(self) -> int:
        return self.rounds.requests()

    def close(self) -> None:
        self.rounds.close()
