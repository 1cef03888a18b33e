"""Default values for every flag of ``main.py``, with the original ESync's names and meaning.

Edit this file to change a default for every run on this machine; a command-line flag overrides it.
The resolved configuration of each run is written next to its logs (``config.json``).
"""
import os

_ROOT = os.path.dirname(os.path.abspath(__file__))

# Learning rates keep the original's meaning: a step is lr x the gradient SUMMED over the batch
# (per-sample loss vector, backward(), step(1)); lr 0.05 on the batch mean at -b 64 is 0.05 / 64.
learning_rate = 0.001     # -l: SGD learning rate for sync, async, dcasgd and local modes
momentum = 0.0            # --momentum: their SGD momentum (0: plain SGD, as the original)
local_lr = 0.001          # -ll: learning rate of ESync's local iterations
global_lr = 1.0           # -gl: ESync's global step: params = start + global_lr * mean(delta)
batch_size = 64           # -b: samples per iteration on each device
data_dir = os.path.join(_ROOT, "data")   # -dd: holds fashion-mnist/*.gz (see scripts/prepare_data.py)
gpu = 0                   # -g: GPU id used when cpu == 0
cpu = 0                   # -c: 1 trains on the CPU instead of GPU `gpu`
network = "resnet18-v1"   # -n: model name, see esync.common.catalog.NETWORKS
log_dir = os.path.join(_ROOT, "logs")    # -ld: logs go to <log_dir>/<network>/<mode>/<host>/<device>/
eval_duration = "auto"    # -e: evaluate every this many rounds (iterations in sync/async/local);
                          # auto: every round in a cluster, ~10% of the wall time in local mode
mode = "esync"            # -m: esync, sync, async or local
use_dcasgd = 0            # -dcasgd (async mode): 1 DC-ASGD as published, 2 MXNet's server-side DCASGD
dcasgd_lambda = 0.04      # --dcasgd-lambda: x g*g of the batch-summed gradient (paper's lambda / batch)
split_by_class = 0        # -s: 0 i.i.d.; 1 class-sorted shards fed in class order (the original's
                          # non-i.i.d.); 2 the same shards reshuffled every epoch (milder)
state_server_ip = "127.0.0.1"   # -ip: ESync state server host
state_server_port = "10010"     # -port: ESync state server port

# Beyond the original
seed = 1                  # --seed: data partition, shuffling and initial weights
slowdown = 1.0            # --slowdown: emulate a device this many times slower (>= 1)
max_rounds = 0            # --max-rounds: stop after this many rounds (0: no limit)
max_seconds = 0.0         # --max-seconds: stop after this much training time (0: no limit)
target_accuracy = 0.0     # --target-accuracy: stop once test accuracy reaches it (0: never)
policy = "dynamic"        # --policy: ESync state-server policy, dynamic (original) or planned
aggregation = "mean"      # --aggregation: ESync's rule for the deltas: mean (original), weighted, fednova
outer_momentum = 0.0      # --outer-momentum: momentum on ESync's aggregated delta (0: none)
nesterov = False          # --nesterov: Nesterov form of the outer momentum
outer_adam = False        # --outer-adam: Adam as the outer step (FedAdam; -gl its step size)
outer_beta2 = 0.99        # --outer-beta2: its second moment's decay
outer_epsilon = 1e-3      # --outer-epsilon: its tau
comm_share = 1.0          # --comm-share: exchange's largest share of an ESync round (1: rounds
                          # sized by compute alone, as the original)
max_round_seconds = 0.0   # --max-round-seconds: bound on a stretched round (0: none)
overlap = False           # --overlap: exchange round r while round r+1 computes
carry = False             # --carry: devices that would wait iterate during the exchange, into the next round
carry_slowest = False     # --carry-slowest: the slowest device carries too (dynamic policy)
sit_out_ratio = 0.0       # --sit-out-ratio: a device this many times slower than the fastest sits out (0: all wait, as the original)
comm_dtype = "float32"    # --comm-dtype: ESync's deltas on the wire (float16 halves the bytes)
prox_mu = 0.0             # --prox-mu: FedProx's proximal coefficient for ESync's local steps
scaffold = False          # --scaffold: SCAFFOLD's control variates for ESync's local steps
accumulate = False        # --accumulate: ESync's local iterations sum gradients at the round's model
low_rank = 0              # --low-rank: ESync's large deltas travel as PowerSGD factors of this rank (0: in full)
epsilon = "auto"        # --epsilon: ESync slack: "auto" (scales with iteration time) or absolute seconds (the original: 0.5)
