"""ESync (Li et al., "ESync: An Efficient Synchronous Parallel Algorithm for Distributed ML in
Heterogeneous Clusters"): every device computes for the whole round.

Each round a worker runs local SGD steps (``-ll``) until the state server says the slowest device
is about to finish, then all workers average their model deltas through the parameter server:
``params = start + global_lr * sum(delta) / N``. Batch-norm statistics are averaged too. With
``--local-iters K`` the state server is bypassed and every worker runs exactly K local steps
(K = 1 with ``-gl 1`` is one SSGD step: a test checks that identity).
"""
from mxnet import nd

from esync.algorithms.base import Algorithm, datas
from esync.state_client import StateClient


class ESync(Algorithm):
    kvstore_type = "dist_sync"
    collective_stop = True

    def prepare(self) -> None:
        a, w = self.args, self.worker
        self.client = None
        if a.local_iters:
            return
        url = f"http://{a.state_server_ip}:{a.state_server_port}"
        self.client = StateClient(url, job=a.job, token=a.state_token)
        if w.rank == 0:
            # Before the KVStore barrier in init: no worker reports before the job exists.
            self.client.init(w.num_workers, epsilon=a.epsilon, policy=a.policy)

    def setup(self) -> None:
        w = self.worker
        self.trainer = self.sgd(self.args.local_lr)
        self.weights = datas(w.trainable)
        self.start = [x.copy() for x in self.weights]
        self.delta_sum = [nd.zeros_like(x) for x in self.weights]
        self.aux = datas(w.aux)
        self.aux_sum = [nd.zeros_like(x) for x in self.aux]
        self.round = 1
        self.planned_k = None

    def announce(self, *, host: str, device: str) -> None:
        if self.client is not None:
            self.client.hello(self.worker.rank, host=host, device=device)

    def continue_local(self, k: int, last_c: float, record) -> bool:
        a, w = self.args, self.worker
        if a.local_iters:
            return k < a.local_iters
        with record.phase("check ready"):
            if a.policy == "planned":
                if k == 0:
                    self.planned_k = self.client.plan(w.rank, last_c)
                return k < self.planned_k
            ready = self.client.apply(w.rank, k, last_c)
        return k == 0 or not ready

    def local_step(self, record) -> None:
        with record.phase("local update"):
            self.trainer.step(1)

    def aggregate(self, record, want_stop: bool) -> bool:
        w, n = self.worker, self.worker.num_workers
        with record.phase("global update"):
            deltas = [x - s for x, s in zip(self.weights, self.start)]
            stop = self.exchange(deltas + self.aux, self.delta_sum + self.aux_sum,
                                 w.keys.trainable + w.keys.aux, want_stop)
            scale = self.args.global_lr / n
            for p, start, total in zip(w.trainable, self.start, self.delta_sum):
                start += scale * total
                p.set_data(start)
            for p, total in zip(w.aux, self.aux_sum):
                p.set_data(total / n)
        self.round += 1
        if self.client is not None:
            with record.phase("reset state server"):
                self.client.reset(w.rank, self.round)
        return stop

    def state_requests(self) -> int:
        return self.client.requests_made if self.client is not None else 0
