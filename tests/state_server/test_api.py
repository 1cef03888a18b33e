"""The state server's HTTP API through Django's test client: answers, validation, tokens, history."""
import json
from urllib.parse import urlencode

import pytest
from django.test import Client, override_settings
from django.urls import reverse

from coordination import services
from coordination.http import (ERR_BODY_TOO_LARGE, ERR_JOB_NAME, ERR_MISSING, ERR_NOT_INTEGER,
                               ERR_NOT_NUMBER, ERR_TOKEN_MISSING, ERR_TOKEN_WRONG)
from coordination.models import Job, WorkerRound
from coordination.services import ERR_UNKNOWN_JOB
from esync.coordination.limits import ERR_C, ERR_EPSILON, ERR_K, ERR_NUM_WORKERS, ERR_POLICY, ERR_RANK, ERR_ROUND, ERR_WRONG_POLICY_PLAN

pytestmark = pytest.mark.usefixtures("fresh_state")


@pytest.fixture
def client(token):
    return Client(headers={"Authorization": f"Bearer {token}"})


@pytest.fixture
def anonymous():
    return Client()


def post_json(client, url, data):
    return client.post(url, data=json.dumps(data), content_type="application/json")


def post_form(client, url, data):
    return client.post(url, data=urlencode(data), content_type="application/x-www-form-urlencoded")


def job_url(action, job="j"):
    return reverse(f"job-{action}", kwargs={"job": job})


@pytest.fixture
def job(client):
    """Job "j": 4 workers, dynamic, auto slack; ranks 0 and 3 have reported once (round 1:
    ranks 1 and 2 are not timed yet, so nobody is ready)."""
    post_json(client, job_url("init"), {"num_workers": 4})
    post_json(client, job_url("apply"), {"r": 0, "k": 1, "c": 0.01})
    post_json(client, job_url("apply"), {"r": 3, "k": 1, "c": 0.08})
    return "j"


def state_of(client, job="j"):
    """The job's live state without the clock-dependent ages."""
    state = client.get(reverse("job-state", kwargs={"job": job})).json()
    for worker in state["workers"]:
        worker.pop("seen_ago")
    return state


# -- the original's paths and bodies ---------------------------------------------------------

def test_original_paths_act_on_the_default_job_with_form_bodies(client):
    post_form(client, reverse("init"), {"num_workers": 2, "epsilon": 0.5})
    answer = post_form(client, reverse("apply"), {"r": 1, "k": 1, "c": 0.2, "te": 1.7e9})
    # rank 0 has no duration yet, so the slowest is not known: rank 1 computes on (the
    # original client reads only "ready"), asking again after its own iteration
    assert answer.status_code == 200 and answer.json() == {"ready": 0, "budget": 0.2, "wait": 0.0}
    assert client.get(reverse("state")).json()["epsilon"] == 0.5


def test_multipart_form_bodies_are_accepted(client):
    response = client.post(reverse("init"), data={"num_workers": "3"})
    assert response.status_code == 200 and response.json()["num_workers"] == 3


def test_init_defaults_to_auto_slack_the_dynamic_policy_and_rounds_sized_by_compute(client):
    answer = post_json(client, job_url("init"), {"num_workers": 4}).json()
    assert answer == {"job": "j", "run": 1, "num_workers": 4, "epsilon": "auto",
                      "policy": "dynamic", "round": 1,
                      "sizing": {"comm_share": 1.0, "max_round": 0.0, "overlap": False}}


def test_apply_with_json_answers_not_ready_on_the_first_report(client, job):
    response = post_json(client, job_url("apply"), {"r": 1, "k": 0, "c": 0}).json()
    assert (response["ready"], response["wait"]) == (0, 0.0)
    assert 0.0 < response["budget"] <= 0.08          # the slowest so far (rank 3) is computing


def test_worker_timestamp_does_not_change_the_decision(client, job):
    far_future = post_json(client, job_url("apply"), {"r": 3, "k": 1, "c": 0.08, "te": 9e12})
    # round 1, ranks 1 and 2 untimed: it computes on, asking again after its own iteration
    assert far_future.json() == {"ready": 0, "budget": 0.08, "wait": 0.0}


def test_plan_answers_the_local_iterations_of_the_round(client):
    post_json(client, job_url("init"), {"num_workers": 2, "policy": "planned"})
    post_json(client, job_url("plan"), {"r": 1, "c": 0.08})
    assert post_json(client, job_url("plan"), {"r": 0, "c": 0.01}).json() == {"k": 8}


def test_plan_on_a_dynamic_job_is_a_conflict(client, job):
    response = post_json(client, job_url("plan"), {"r": 0, "c": 0.01})
    assert response.status_code == 409
    assert response.json() == {"error": ERR_WRONG_POLICY_PLAN, "field": "policy"}


def test_reset_enters_the_round_for_every_worker(client, job):
    answer = post_json(client, job_url("reset"), {"r": 0, "t": 2, "te": 5.0})
    assert answer.json() == {"round": 2} and state_of(client)["round"] == 2


def test_history_lists_each_closed_round_per_worker(client, job):
    for rank in (0, 3):
        post_json(client, job_url("reset"), {"r": rank, "t": 2})
    history = client.get(job_url("history")).json()
    workers = history["rounds"][0]["workers"]
    assert history["rounds"][0]["round"] == 1 and history["current_round"] == 2
    assert [(w["rank"], w["k"], w["c"]) for w in workers] == [(0, 1, 0.01), (3, 1, 0.08)]


def test_history_of_an_earlier_run_stays_readable(client, job):
    post_json(client, job_url("reset"), {"r": 0, "t": 2})
    post_json(client, job_url("init"), {"num_workers": 2})
    earlier = client.get(job_url("history"), {"run": 1}).json()
    assert earlier["run"] == 1 and earlier["runs"] == 2 and len(earlier["rounds"]) == 1


def test_jobs_lists_every_job(client, job):
    post_json(client, job_url("init", "other"), {"num_workers": 1})
    names = [j["name"] for j in client.get(reverse("jobs")).json()["jobs"]]
    assert names == ["j", "other"]


def test_route_without_trailing_slash_is_served(client, job):
    response = post_json(client, "/jobs/j/apply", {"r": 3, "k": 1, "c": 0.08})
    assert response.status_code == 200


def test_reads_need_no_token(anonymous, job):
    assert anonymous.get(reverse("job-state", kwargs={"job": "j"})).status_code == 200


# -- validation: 4xx naming the field, state unchanged ------------------------------------------

APPLY_ERRORS = [
    ({"k": 1, "c": 0.1}, "r", ERR_MISSING.format(field="r")),
    ({"r": 0, "c": 0.1}, "k", ERR_MISSING.format(field="k")),
    ({"r": 0, "k": 1}, "c", ERR_MISSING.format(field="c")),
    ({"r": "zero", "k": 1, "c": 0.1}, "r", ERR_NOT_INTEGER.format(field="r", value="'zero'")),
    ({"r": 0, "k": 1.5, "c": 0.1}, "k", ERR_NOT_INTEGER.format(field="k", value="1.5")),
    ({"r": 0, "k": True, "c": 0.1}, "k", ERR_NOT_INTEGER.format(field="k", value="True")),
    ({"r": 0, "k": 1, "c": "fast"}, "c", ERR_NOT_NUMBER.format(field="c", value="'fast'")),
    ({"r": 0, "k": 1, "c": [1]}, "c", ERR_NOT_NUMBER.format(field="c", value="[1]")),
    ({"r": -1, "k": 1, "c": 0.1}, "r", ERR_RANK.format(num_workers=4)),
    ({"r": 4, "k": 1, "c": 0.1}, "r", ERR_RANK.format(num_workers=4)),
    ({"r": 0, "k": -2, "c": 0.1}, "k", ERR_K),
    ({"r": 0, "k": 10**15, "c": 0.1}, "k", ERR_K),
    ({"r": 0, "k": 1, "c": -0.1}, "c", ERR_C),
    ({"r": 0, "k": 1, "c": 1e300}, "c", ERR_C),
    ({"r": 0, "k": 1, "c": "nan"}, "c", ERR_C),
    ({"r": 0, "k": 1, "c": 0.1, "te": "yesterday"}, "te",
     ERR_NOT_NUMBER.format(field="te", value="'yesterday'")),
]


@pytest.mark.parametrize("fields, field, message", APPLY_ERRORS)
def test_bad_apply_is_rejected_naming_the_field(client, job, fields, field, message):
    before = state_of(client)
    response = post_json(client, job_url("apply"), fields)
    assert response.status_code == 400
    assert response.json() == {"error": message, "field": field}
    assert state_of(client) == before


@pytest.mark.parametrize("fields, field, message", [
    ({"r": 0, "k": "-2", "c": "0.1"}, "k", ERR_K),
    ({"r": "4", "k": "1", "c": "0.1"}, "r", ERR_RANK.format(num_workers=4)),
    ({"r": "0", "k": "1", "c": "1e400"}, "c", ERR_C),
    ({"r": "0", "k": "", "c": "0.1"}, "k", ERR_MISSING.format(field="k")),
])
def test_bad_form_apply_is_rejected_naming_the_field(client, job, fields, field, message):
    before = state_of(client)
    response = post_form(client, job_url("apply"), fields)
    assert (response.status_code, response.json()) == (400, {"error": message, "field": field})
    assert state_of(client) == before


@pytest.mark.parametrize("fields, field, message", [
    ({}, "num_workers", ERR_MISSING.format(field="num_workers")),
    ({"num_workers": 0}, "num_workers", ERR_NUM_WORKERS),
    ({"num_workers": 10**9}, "num_workers", ERR_NUM_WORKERS),
    ({"num_workers": 2, "epsilon": -1}, "epsilon", ERR_EPSILON),
    ({"num_workers": 2, "epsilon": 1e6}, "epsilon", ERR_EPSILON),
    ({"num_workers": 2, "policy": "greedy"}, "policy", ERR_POLICY),
])
def test_bad_init_is_rejected_and_leaves_the_job_as_it_was(client, job, fields, field, message):
    before = state_of(client)
    response = post_json(client, job_url("init"), fields)
    assert (response.status_code, response.json()) == (400, {"error": message, "field": field})
    assert state_of(client) == before and Job.objects.get(name="j").run == 1


@pytest.mark.parametrize("fields, field, message", [
    ({"r": 0}, "t", ERR_MISSING.format(field="t")),
    ({"r": 0, "t": 0}, "t", ERR_ROUND),
    ({"r": 0, "t": 10**12}, "t", ERR_ROUND),
    ({"r": 9, "t": 2}, "r", ERR_RANK.format(num_workers=4)),
])
def test_bad_reset_is_rejected(client, job, fields, field, message):
    response = post_json(client, job_url("reset"), fields)
    assert (response.status_code, response.json()) == (400, {"error": message, "field": field})
    assert state_of(client)["round"] == 1 and not WorkerRound.objects.exists()


def test_oversized_body_is_rejected_with_413(client, job):
    before = state_of(client)
    response = post_json(client, job_url("apply"), {"r": 0, "k": 1, "c": 0.1, "pad": "x" * 10000})
    assert response.status_code == 413
    assert response.json()["error"] == ERR_BODY_TOO_LARGE.format(limit=4096)
    assert state_of(client) == before


def test_body_that_is_not_json_is_rejected(client, job):
    response = client.post(job_url("apply"), data="{r: 0", content_type="application/json")
    assert response.status_code == 400 and "not a JSON object" in response.json()["error"]


def test_json_array_body_is_rejected(client, job):
    response = client.post(job_url("apply"), data="[0, 1, 0.1]", content_type="application/json")
    assert response.status_code == 400 and "not a JSON object" in response.json()["error"]


def test_unknown_job_is_404_naming_the_job(client):
    response = post_json(client, job_url("apply", "nope"), {"r": 0, "k": 1, "c": 0.1})
    assert response.status_code == 404
    assert response.json() == {"error": ERR_UNKNOWN_JOB.format(job="nope"), "field": "job"}


def test_default_job_before_init_is_404(client):
    assert post_json(client, reverse("apply"), {"r": 0, "k": 1, "c": 0.1}).status_code == 404


def test_home_before_init_answers_200_saying_the_default_job_does_not_exist(client):
    response = client.get(reverse("state"))
    assert (response.status_code, response.json()["initialised"]) == (200, False)


def test_malformed_job_name_is_rejected(client):
    response = post_json(client, job_url("init", "a*b"), {"num_workers": 2})
    assert (response.status_code, response.json()) == (400, {"error": ERR_JOB_NAME, "field": "job"})


def test_wrong_method_is_405_json(client, job):
    response = client.get(job_url("apply"))
    assert response.status_code == 405 and response["Allow"] == "POST"
    assert "not allowed" in response.json()["error"]


def test_unknown_path_is_404_json(client):
    response = client.get("/no/such/thing/")
    assert response.status_code == 404 and "no such endpoint" in response.json()["error"]


# -- the token -----------------------------------------------------------------------------------

def test_state_change_without_token_is_401_and_changes_nothing(anonymous, client, job):
    before = state_of(client)
    response = post_json(anonymous, job_url("init"), {"num_workers": 2})
    assert response.status_code == 401
    assert response.json() == {"error": ERR_TOKEN_MISSING, "field": "token"}
    assert state_of(client) == before


def test_state_change_with_wrong_token_is_403_and_changes_nothing(client, job):
    before = state_of(client)
    intruder = Client(headers={"Authorization": "Bearer guess"})
    response = post_json(intruder, job_url("reset"), {"r": 0, "t": 5})
    assert response.status_code == 403
    assert response.json() == {"error": ERR_TOKEN_WRONG, "field": "token"}
    assert state_of(client) == before


def test_token_may_come_as_a_form_field(anonymous, token):
    response = post_form(anonymous, reverse("init"), {"num_workers": 2, "token": token})
    assert response.status_code == 200


def test_anonymous_calls_pass_when_explicitly_allowed(anonymous):
    with override_settings(ESYNC_STATE_ALLOW_ANONYMOUS=True):
        response = post_form(anonymous, reverse("init"), {"num_workers": 2, "epsilon": 0.5})
    assert response.status_code == 200


def test_wrong_token_is_refused_even_when_anonymous_calls_are_allowed(job):
    intruder = Client(headers={"Authorization": "Bearer guess"})
    with override_settings(ESYNC_STATE_ALLOW_ANONYMOUS=True):
        response = post_json(intruder, job_url("apply"), {"r": 0, "k": 1, "c": 0.1})
    assert response.status_code == 403


# -- restart -------------------------------------------------------------------------------------

def test_job_is_rebuilt_from_the_database_after_a_restart(client, job):
    for rank in range(4):
        post_json(client, job_url("reset"), {"r": rank, "t": 3})
    services.registry.clear()                   # what a restart does to the memory
    answer = post_json(client, job_url("apply"), {"r": 2, "k": 1, "c": 0.05})
    rebuilt = state_of(client)
    assert answer.status_code == 200
    assert (rebuilt["round"], rebuilt["num_workers"], rebuilt["epsilon"]) == (3, 4, "auto")
