"""ESync's parts (esync.common.esync_parts) and the algorithm composed of them
(esync.worker.algorithms.esync): every pair of choices is either refused with a message naming
the flag and its fix, or builds an ESync with the parts the flags ask for; ``conflict`` lets a
launcher's default yield, and unset values exclude nothing.

The pairs below are written by hand, not read from the declarations, so a declaration that
changes changes a test.
"""
import ast
import itertools
from argparse import Namespace

import mxnet as mx
import pytest

from esync import cli
from esync.common import esync_parts
from esync.common.errors import UsageError
from esync.worker import models
from esync.worker.algorithms.base import AlgorithmConfig, Worker
from esync.worker.algorithms.esync import ESync
from esync.worker.algorithms.esync.local_rule import Accumulated, LocalSGD
from esync.worker.algorithms.esync.schedule import Blocking, Carrying, Overlapped
from esync.worker.algorithms.esync.sizing import DynamicRounds, FixedRounds, PlannedRounds
from esync.worker.algorithms.esync.wire import FactoredDeltas, FullDeltas
from esync.worker.kvstore import KeyMap

from support import REPO

# main.py's flags that turn each choice on (with what it needs to run)
TURNS_ON = {
    "outer_momentum": ["--outer-momentum", "0.9"],
    "outer_adam": ["--outer-adam"],
    "nesterov": ["--outer-momentum", "0.5", "--nesterov"],
    "low_rank": ["--low-rank", "4"],
    "comm_dtype": ["--comm-dtype", "float16"],
    "overlap": ["--overlap"],
    "carry": ["--carry"],
    "carry_slowest": ["--carry", "--carry-slowest"],
    "accumulate": ["--accumulate"],
    "prox_mu": ["--prox-mu", "0.1"],
    "scaffold": ["--scaffold"],
    "local_iters": ["--local-iters", "3"],
    "policy": ["--policy", "planned"],
}

# The pairs that cannot run: (the flag refused, a word of its fix). carry_slowest's flags
# include --carry, which is refused first where both would be.
FORBIDDEN = {
    frozenset({"outer_adam", "nesterov"}): ("--nesterov", "--no-outer-adam"),
    frozenset({"low_rank", "overlap"}): ("--low-rank", "--no-overlap"),
    frozenset({"low_rank", "comm_dtype"}): ("--low-rank", "--comm-dtype float32"),
    frozenset({"low_rank", "scaffold"}): ("--low-rank", "--no-scaffold"),
    frozenset({"carry", "overlap"}): ("--carry", "--no-overlap"),
    frozenset({"carry", "local_iters"}): ("--carry", "--local-iters at 0"),
    frozenset({"carry_slowest", "overlap"}): ("--carry", "--no-overlap"),
    frozenset({"carry_slowest", "local_iters"}): ("--carry", "--local-iters at 0"),
    frozenset({"carry_slowest", "policy"}): ("--carry-slowest", "--policy dynamic"),
    frozenset({"accumulate", "overlap"}): ("--accumulate", "--no-overlap"),
    frozenset({"accumulate", "prox_mu"}): ("--accumulate", "--prox-mu 0"),
    frozenset({"accumulate", "scaffold"}): ("--accumulate", "--no-scaffold"),
}
# Allowed pairs of one part where one choice runs the part: --local-iters fixes k whatever the
# policy says (as ESync did before its parts).
YIELDS = {frozenset({"local_iters", "policy"}): "policy"}
PAIRS = list(itertools.combinations(TURNS_ON, 2))
ALLOWED = [pair for pair in PAIRS if frozenset(pair) not in FORBIDDEN]
REFUSED = [pair for pair in PAIRS if frozenset(pair) in FORBIDDEN]


def test_the_table_here_names_every_choice_the_catalog_declares():
    assert set(TURNS_ON) == {c.option for c in esync_parts.CHOICES}
    assert all(c.part in esync_parts.PARTS for c in esync_parts.CHOICES)


@pytest.mark.parametrize("pair", REFUSED, ids=["+".join(p) for p in REFUSED])
def test_a_forbidden_pair_is_one_error_naming_the_flag_and_the_fix(pair):
    flag, fix = FORBIDDEN[frozenset(pair)]
    with pytest.raises(UsageError) as caught:
        cli.parse_args(TURNS_ON[pair[0]] + TURNS_ON[pair[1]])
    message = str(caught.value)
    assert message.startswith(f"argument {flag}: ") and fix in message
    assert message.endswith(f" (or {esync_parts.choice(_option(flag)).off})")


def _option(flag: str) -> str:
    return next(c.option for c in esync_parts.CHOICES if c.flag == flag)


@pytest.mark.parametrize("given,words", [
    (["-m", "sync", "--low-rank", "4"], ["--low-rank", "-m sync", "use -m esync"]),
    (["-m", "sync", "--comm-dtype", "float16"], ["--comm-dtype", "-m sync", "-m esync"]),
    (["-m", "async", "--carry"], ["--carry", "-m async", "use -m esync"]),
    (["-m", "sync", "--accumulate"], ["--accumulate", "-m sync", "use -m esync"]),
    (["--collective", "allreduce", "--low-rank", "4"], ["--low-rank", "--collective ps"]),
    (["--carry-slowest"], ["--carry-slowest", "add --carry"]),
    (["--nesterov"], ["--nesterov", "--outer-momentum"]),
])
def test_a_choice_refused_by_what_it_needs_or_by_the_mode_names_the_fix(given, words):
    with pytest.raises(UsageError) as caught:
        cli.parse_args(given)
    assert all(word in str(caught.value) for word in words), str(caught.value)


def _built(argv) -> ESync:
    """An ESync from main.py's flags, prepared and set up on lenet without a cluster (rank 1:
    no job is created, no HTTP is sent)."""
    config = AlgorithmConfig.from_args(cli.parse_args(argv))
    ctx = mx.cpu()
    net = models.build("lenet", ctx, seed=1)
    trainable, aux = models.trainable_and_aux(net)
    worker = Worker(config=config, ctx=ctx, net=net, trainable=trainable, aux=aux, rank=1,
                    num_workers=2)
    algo = ESync(worker)
    algo.prepare()
    worker.keys = KeyMap(len(trainable), len(aux), len(algo.state_arrays()),
                         len(algo.extra_keys()))
    algo.setup()
    return algo


# what each choice must have put into the built algorithm
SHOWS = {
    "outer_momentum": lambda a: a.outer.optimizer.momentum > 0 and a.outer.momentum[0] is not None,
    "outer_adam": lambda a: a.outer.optimizer.adam and len(a.outer.variance) > 0,
    "nesterov": lambda a: a.outer.optimizer.nesterov,
    "low_rank": lambda a: isinstance(a.wire, FactoredDeltas) and a.wire.factors.indices,
    "comm_dtype": lambda a: type(a.wire) is FullDeltas and a.wire.sums[0].dtype.__name__
    == "float16",
    "overlap": lambda a: type(a.schedule) is Overlapped and a.exchange.round_start
    is not a.exchange.start,
    "carry": lambda a: type(a.schedule) is Carrying,
    "carry_slowest": lambda a: type(a.schedule) is Carrying and a.config.carry_slowest,
    "accumulate": lambda a: type(a.local) is Accumulated,
    "prox_mu": lambda a: type(a.local) is LocalSGD and a.local.mu == 0.1,
    "scaffold": lambda a: type(a.local) is LocalSGD and a.local.variates is not None,
    "local_iters": lambda a: type(a.rounds) is FixedRounds,
    "policy": lambda a: type(a.rounds) is PlannedRounds,
}


def test_the_defaults_build_the_original_parts():
    algo = _built([])
    try:
        assert (type(algo.rounds), type(algo.local), type(algo.wire), type(algo.schedule)) == \
            (DynamicRounds, LocalSGD, FullDeltas, Blocking)
        assert algo.extra_keys() == [] and algo.state_arrays() == {}
    finally:
        algo.close()


@pytest.mark.parametrize("pair", ALLOWED, ids=["+".join(p) for p in ALLOWED])
def test_every_allowed_pair_builds_with_the_parts_it_asks_for(pair):
    algo = _built(TURNS_ON[pair[0]] + TURNS_ON[pair[1]])
    try:
        shown = [option for option in pair if option != YIELDS.get(frozenset(pair))]
        assert all(SHOWS[option](algo) for option in shown)
        # each exchanged array has a key, and the model's keys are not reused for extra arrays
        assert len(algo.worker.keys.extra) == len(algo.extra_keys())
    finally:
        algo.close()


def test_the_extra_keys_go_float16_deltas_then_variates_then_factors():
    algo = _built(["--comm-dtype", "float16", "--scaffold"])
    n = len(algo.worker.trainable)
    extra = algo.worker.keys.extra
    assert algo.wire.keys == extra[:n] and algo.local.variates.keys == extra[n:2 * n]
    assert [d for _, d in algo.extra_keys()] == ["float16"] * n + ["float32"] * n
    algo.close()
    factored = _built(["--low-rank", "4"])
    assert factored.wire.keys == factored.worker.keys.trainable
    assert factored.wire.factors.p_keys == factored.worker.keys.extra[
        :len(factored.wire.factors.indices)]
    factored.close()


# conflict: what the launcher asks before a default ---------------------------------------------

def test_unset_settings_exclude_nothing():
    for option in TURNS_ON:
        assert esync_parts.conflict(option, Namespace(mode="esync")) is None
        assert esync_parts.conflict(option, {}) is None


def test_a_launcher_default_yields_to_a_flag_the_user_gave():
    unset = dict(mode="esync", overlap=None, comm_dtype=None, scaffold=None, collective="ps",
                 local_iters=(0,), prox_mu=None)
    assert esync_parts.conflict("low_rank", unset) is None
    assert "--no-overlap" in esync_parts.conflict("low_rank", dict(unset, overlap=True))
    assert esync_parts.conflict("carry", unset) is None
    assert "--local-iters at 0" in esync_parts.conflict("carry", dict(unset, local_iters=(3, 3)))
    assert esync_parts.conflict("accumulate", dict(unset, overlap=False)) is None
    assert "--prox-mu 0" in esync_parts.conflict("accumulate", dict(unset, prox_mu=0.1))


def test_what_a_choice_needs_refuses_only_once_it_is_set():
    assert esync_parts.conflict("carry_slowest", {}) is None
    assert "add --carry" in esync_parts.conflict("carry_slowest", {"carry": False})
    assert esync_parts.conflict("carry_slowest", {"carry": True}) is None
    assert esync_parts.conflict("nesterov", {"outer_momentum": None}) is None
    assert "--outer-momentum" in esync_parts.conflict("nesterov", {"outer_momentum": 0.0})


def test_the_fix_names_the_mode_given():
    assert esync_parts.conflict("comm_dtype", {"mode": "sync", "comm_dtype": "float16"}) == (
        "float16 is the type of ESync's deltas; -m sync exchanges float32 gradients and "
        "weights: use -m esync")


def test_chosen_takes_the_first_choice_of_a_part_and_none_for_its_default():
    assert esync_parts.chosen("round sizing", {"local_iters": 3, "policy": "planned"}) == \
        "local_iters"
    assert esync_parts.chosen("round sizing", {"local_iters": 0, "policy": "planned"}) == \
        "policy"
    assert esync_parts.chosen("round sizing", {"local_iters": 0, "policy": "dynamic"}) is None
    assert esync_parts.chosen("wire", {"comm_dtype": "float32", "low_rank": 0}) is None


def test_an_unknown_option_or_part_says_which_there_are():
    with pytest.raises(KeyError, match="low_rank"):
        esync_parts.conflict("low-rank", {})
    with pytest.raises(KeyError, match="round sizing"):
        esync_parts.chosen("sizing", {})


def test_every_algorithm_module_and_class_reads_in_one_sitting():
    """The algorithms' package stays in pieces a reader can hold: no file over 350 lines, no
    class over 200 (ESync was one 501-line class in a 700-line file before its parts)."""
    too_long = []
    for path in sorted((REPO / "esync" / "worker" / "algorithms").rglob("*.py")):
        text = path.read_text()
        if len(text.splitlines()) > 350:
            too_long.append(f"{path.name}: {len(text.splitlines())} lines")
        too_long += [f"{path.name}: class {node.name} of {node.end_lineno - node.lineno + 1}"
                     for node in ast.walk(ast.parse(text)) if isinstance(node, ast.ClassDef)
                     and node.end_lineno - node.lineno + 1 > 200]
    assert too_long == []


def test_a_preset_value_yields_by_the_same_declarations():
    """esync-cluster's presets ask cli.preset_excluded, which reads the parts' declarations: a
    preset's Nesterov yields to a user's --outer-adam, its --carry to --overlap, and a value
    that turns nothing on never yields."""
    on = {"mode": "esync", "outer_momentum": 0.9, "outer_adam": True, "nesterov": True}
    assert "--outer-adam" in cli.preset_excluded("nesterov", on)
    assert cli.preset_excluded("nesterov", dict(on, outer_adam=False)) is None
    assert cli.preset_excluded("carry", {"mode": "esync", "carry": True, "overlap": True}) \
        .startswith("--overlap")
    assert cli.preset_excluded("carry", {"mode": "esync", "carry": False, "overlap": True}) is None
    assert cli.preset_excluded("comm_share", {"mode": "sync", "comm_share": 0.2}) is None
