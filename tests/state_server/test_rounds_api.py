"""Round reports, idempotent retries and what a restart rebuilds, through Django's test client."""
import json

import pytest
from django.test import Client
from django.urls import reverse

from coordination import services
from coordination.models import Job, RoundReport, WorkerRound, WorkerState

pytestmark = pytest.mark.usefixtures("fresh_state")


@pytest.fixture
def client(token):
    return Client(headers={"Authorization": f"Bearer {token}"})


def post(client, action, data, job="p"):
    return client.post(reverse(f"job-{action}", kwargs={"job": job}), data=json.dumps(data),
                       content_type="application/json")


def live_state(client, job="p"):
    state = client.get(reverse("job-state", kwargs={"job": job})).json()
    for worker in state["workers"]:
        worker.pop("seen_ago")
        worker.pop("requests")
    return state


@pytest.fixture
def planned(client):
    post(client, "init", {"num_workers": 3, "policy": "planned"})
    return "p"


def test_round_report_answers_the_plan_of_every_worker(client, planned):
    answer = post(client, "rounds", {"t": 1, "k": [1, 1, 1], "c": [0.02, 0.08, 0.04]})
    assert (answer.status_code, answer.json()) == (200, {"t": 1, "plan": [4, 1, 2]})


def test_round_report_is_committed_with_every_worker_of_the_round(client, planned):
    post(client, "rounds", {"t": 1, "k": [4, 1, 2], "c": [0.02, 0.08, 0.04]})
    rows = WorkerRound.objects.filter(round=1).order_by("rank").values_list("rank", "k", "c")
    assert list(rows) == [(0, 4, 0.02), (1, 1, 0.08), (2, 2, 0.04)]


def test_a_repeated_round_report_gets_the_same_plan_and_writes_nothing(client, planned):
    first = post(client, "rounds", {"t": 1, "k": [1, 1, 1], "c": [0.02, 0.08, 0.04]}).json()
    again = post(client, "rounds", {"t": 1, "k": [1, 1, 1], "c": [0.08, 0.01, 0.01]}).json()
    assert (again, WorkerRound.objects.count(), RoundReport.objects.count()) == (first, 3, 1)


def test_round_report_without_token_is_refused(planned):
    answer = post(Client(), "rounds", {"t": 1, "k": [1, 1, 1], "c": [0.02, 0.08, 0.04]})
    assert answer.status_code == 401 and not WorkerRound.objects.exists()


def test_round_report_that_is_not_a_list_is_rejected_naming_the_field(client, planned):
    answer = post(client, "rounds", {"t": 1, "k": "1,1,1", "c": [0.02, 0.08, 0.04]})
    assert (answer.status_code, answer.json()["field"]) == (400, "k")


def test_round_report_on_a_dynamic_job_is_a_conflict(client):
    post(client, "init", {"num_workers": 2}, job="d")
    answer = post(client, "rounds", {"t": 1, "k": [1, 1], "c": [0.1, 0.1]}, job="d")
    assert answer.status_code == 409


def test_a_restart_rebuilds_the_plan_and_rounds_of_a_reported_job(client, planned):
    post(client, "rounds", {"t": 1, "k": [1, 1, 1], "c": [0.02, 0.08, 0.04]})
    before = live_state(client)
    services.registry.clear()                          # what a restart does to the memory
    again = post(client, "rounds", {"t": 1, "k": [1, 1, 1], "c": [0.02, 0.08, 0.04]}).json()
    after = live_state(client)
    assert again == {"t": 1, "plan": [4, 1, 2]}
    assert [(w["round"], w["c"], w["planned_k"]) for w in after["workers"]] == [
        (w["round"], w["c"], w["planned_k"]) for w in before["workers"]]


def test_every_workers_round_is_committed_before_reset_answers(client):
    post(client, "init", {"num_workers": 2}, job="d")
    post(client, "apply", {"r": 1, "k": 1, "c": 0.3}, job="d")
    post(client, "reset", {"r": 1, "t": 3}, job="d")
    post(client, "reset", {"r": 0, "t": 2}, job="d")
    rows = WorkerState.objects.order_by("rank").values_list("rank", "round", "c")
    assert list(rows) == [(0, 2, 0.0), (1, 3, 0.3)]


def test_a_restart_rebuilds_each_workers_round_and_duration(client):
    post(client, "init", {"num_workers": 2}, job="d")
    post(client, "apply", {"r": 1, "k": 1, "c": 0.3}, job="d")
    post(client, "reset", {"r": 1, "t": 3}, job="d")
    post(client, "reset", {"r": 0, "t": 2}, job="d")
    services.registry.clear()
    workers = live_state(client, "d")["workers"]
    assert [(w["round"], w["c"]) for w in workers] == [(2, 0.0), (3, 0.3)]


def test_a_late_reset_of_an_older_round_does_not_move_the_worker_back(client):
    post(client, "init", {"num_workers": 2}, job="d")
    post(client, "reset", {"r": 0, "t": 5}, job="d")
    answer = post(client, "reset", {"r": 0, "t": 4}, job="d")
    assert (answer.json(), live_state(client, "d")["workers"][0]["round"]) == ({"round": 5}, 5)


def test_a_retried_init_with_the_same_key_starts_no_new_run(client):
    post(client, "init", {"num_workers": 2, "key": "k1"}, job="d")
    post(client, "reset", {"r": 0, "t": 4}, job="d")
    again = post(client, "init", {"num_workers": 2, "key": "k1"}, job="d").json()
    assert (again["run"], again["round"], Job.objects.get(name="d").run) == (1, 4, 1)


def test_an_init_with_a_new_key_starts_a_new_run(client):
    post(client, "init", {"num_workers": 2, "key": "k1"}, job="d")
    assert post(client, "init", {"num_workers": 2, "key": "k2"}, job="d").json()["run"] == 2


def test_a_batch_of_round_reports_records_every_round_and_answers_the_last_plan(client, planned):
    batch = [{"t": t, "k": [1, 1, 1], "c": [0.02, 0.08, 0.04]} for t in (1, 2, 3)]
    answer = post(client, "rounds", {"rounds": batch}).json()
    recorded = sorted(set(WorkerRound.objects.values_list("round", flat=True)))
    assert (answer, recorded) == ({"t": 3, "plan": [4, 1, 2]}, [1, 2, 3])


def test_a_batch_with_one_bad_report_changes_nothing(client, planned):
    batch = [{"t": 1, "k": [1, 1, 1], "c": [0.02, 0.08, 0.04]},
             {"t": 2, "k": [1, 1], "c": [0.02, 0.08, 0.04]}]
    answer = post(client, "rounds", {"rounds": batch})
    assert (answer.status_code, answer.json()["field"], WorkerRound.objects.count()) == (
        400, "k", 0)


def test_after_a_restart_a_worker_is_not_kept_waiting_for_a_slowest_already_ready(client):
    post(client, "init", {"num_workers": 2}, job="d")
    for rank, c in ((0, 0.01), (1, 0.3)):                # round 1, committed with the resets
        post(client, "apply", {"r": rank, "k": 1, "c": c, "t": 1}, job="d")
        post(client, "reset", {"r": rank, "t": 2}, job="d")
    post(client, "apply", {"r": 0, "k": 0, "c": 0.01, "t": 2}, job="d")
    post(client, "apply", {"r": 1, "k": 1, "c": 0.3, "t": 2}, job="d")   # ready: in the exchange
    services.registry.clear()                           # the server restarts
    answer = post(client, "apply", {"r": 0, "k": 1, "c": 0.01, "t": 2}, job="d")
    assert answer.json() == {"ready": 1, "budget": 0.0, "wait": 0.0}


def test_a_round_entered_by_apply_and_lost_in_a_restart_is_entered_again(client):
    """The round an /apply/ enters is written with the next commit, not before the answer; a
    restart in between loses it, and the workers' next calls (which carry t) enter it again."""
    post(client, "init", {"num_workers": 2}, job="d")
    for rank, c in ((0, 0.01), (1, 0.3)):               # round 1: both ready (committed)
        post(client, "apply", {"r": rank, "k": 1, "c": c, "t": 1}, job="d")
    for rank, c in ((1, 0.3), (0, 0.01)):               # round 2 entered, not committed yet
        answer = post(client, "apply", {"r": rank, "k": 0, "c": c, "t": 2}, job="d")
        assert answer.json()["ready"] == 0
    assert WorkerState.objects.get(job__name="d", rank=0).round == 1
    services.registry.clear()                           # the server restarts
    slow = post(client, "apply", {"r": 1, "k": 1, "c": 0.3, "t": 2}, job="d")
    fast = post(client, "apply", {"r": 0, "k": 1, "c": 0.01, "t": 2}, job="d")
    assert (slow.json()["ready"], fast.json()["ready"]) == (1, 1)
    assert [w["round"] for w in WorkerState.objects.filter(job__name="d").order_by(
        "rank").values("round")] == [2, 2]
    assert sorted(WorkerRound.objects.filter(job__name="d").values_list("round", "rank")) == [
        (1, 0), (1, 1)]


def test_rounds_stretched_by_reported_transfer_times_survive_a_restart(client):
    """Round sizing is part of the job: given at init, persisted, and the reported transfer
    times ("d") stretch the plan (comm / (T + comm) <= 0.25: T >= 3 x 0.24 s = 0.72 s)."""
    answer = post(client, "init", {"num_workers": 2, "policy": "planned", "comm_share": 0.25,
                                   "max_round": 5, "overlap": False})
    assert answer.json()["sizing"] == {"comm_share": 0.25, "max_round": 5.0, "overlap": False}
    post(client, "rounds", {"t": 1, "k": [1, 1], "c": [0.02, 0.08]})
    plan = post(client, "rounds", {"t": 2, "k": [4, 1], "c": [0.02, 0.08],
                                   "d": [0.3, 0.24]}).json()["plan"]
    assert plan == [36, 9]                   # floor(0.72 / c + 1/2)
    services.registry.clear()                # a restarted server rebuilds the job's sizing
    assert live_state(client)["sizing"] == {"comm_share": 0.25, "max_round": 5.0,
                                            "overlap": False}


@pytest.mark.parametrize("fields,field", [
    ({"comm_share": 0}, "comm_share"), ({"comm_share": 2}, "comm_share"),
    ({"comm_share": "lots"}, "comm_share"), ({"max_round": -1}, "max_round"),
    ({"overlap": "maybe"}, "overlap")])
def test_bad_sizing_at_init_is_a_400_naming_the_field(client, fields, field):
    answer = post(client, "init", {"num_workers": 2, "policy": "planned", **fields})
    assert answer.status_code == 400 and answer.json()["field"] == field, answer.content
    assert not Job.objects.filter(name="p").exists()


def test_bad_transfer_times_in_a_round_report_are_a_400(client, planned):
    answer = post(client, "rounds", {"t": 1, "k": [1, 1, 1], "c": [0.1, 0.1, 0.1],
                                     "d": [0.1, "x", 0.1]})
    assert answer.status_code == 400 and answer.json()["field"] == "d"
    assert not WorkerRound.objects.exists()


def test_reported_aggregation_overheads_give_the_fast_workers_more_steps(client, planned):
    post(client, "rounds", {"t": 1, "k": [1, 1, 1], "c": [0.02, 0.08, 0.04]})
    plan = post(client, "rounds", {"t": 2, "k": [4, 1, 2], "c": [0.02, 0.08, 0.04],
                                   "o": [0.0, 0.04, 0.0]}).json()["plan"]
    assert plan == [6, 1, 3]          # floor((0.08 + 0.04) / c_i + 1/3)
    bad = post(client, "rounds", {"t": 3, "k": [4, 1, 2], "c": [0.02, 0.08, 0.04],
                                  "o": [0, -1, 0]})
    assert bad.status_code == 400 and bad.json()["field"] == "o"
