"""The dashboard through Django's test client: the page, its JSON, and the calls that feed it."""
import json
import re

import pytest
from django.test import Client
from django.urls import reverse

from coordination import services
from coordination.http import ERR_TOKEN_MISSING
from coordination.models import Job
from dashboard import services as dashboard_services
from dashboard.services import ERR_ACCURACY, ERR_HELLO_RANK, ERR_HOST, ERR_SLOWDOWN
from esync.coordination.job import JobState
from esync.coordination.limits import PolicyError

pytestmark = pytest.mark.usefixtures("fresh_state")


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


@pytest.fixture
def client(token):
    return Client(headers={"Authorization": f"Bearer {token}"})


@pytest.fixture
def anonymous():
    return Client()


def post(client, name, job, data):
    return client.post(reverse(name, kwargs={"job": job}), data=json.dumps(data),
                       content_type="application/json")


def init(client, job, workers=2, policy="dynamic"):
    assert post(client, "job-init", job, {"num_workers": workers, "policy": policy}).status_code == 200


def board(client, job="j"):
    response = client.get(reverse("dashboard-job", kwargs={"job": job}))
    assert response.status_code == 200, response.content
    return response.json()


@pytest.fixture
def clock():
    return FakeClock()


@pytest.fixture
def dynamic_round(client, clock):
    """Job "j", dynamic, 2 workers on a fake clock: round 1 closed (k = 2 and 1), round 2 begun.

    Rank 0 computes 0.1 s of the 0.25 s round, rank 1 (the slowest, c = 0.2 s) 0.2 s.
    """
    init(client, "j")
    row = Job.objects.get(name="j")
    live = JobState(name="j", num_workers=2, clock=clock)    # as job_init builds it, on our clock
    live.storage_id, live.run = row.pk, row.run
    services.registry.put(live)
    for now, rank, k, c in [(0.0, 0, 0, 0.05), (0.0, 1, 0, 0.2), (0.05, 0, 1, 0.05),
                            (0.1, 0, 2, 0.05), (0.2, 1, 1, 0.2)]:
        clock.now = now
        assert post(client, "job-apply", "j", {"r": rank, "k": k, "c": c}).status_code == 200
    clock.now = 0.25
    for rank in (0, 1):
        assert post(client, "job-reset", "j", {"r": rank, "t": 2}).status_code == 200
    clock.now = 0.3
    post(client, "job-apply", "j", {"r": 0, "k": 1, "c": 0.05})
    return "j"


# -- the page -----------------------------------------------------------------------------------

def test_page_answers_without_a_token(anonymous, client):
    init(client, "j")
    assert anonymous.get(reverse("dashboard")).status_code == 200


def test_page_offers_every_job_to_choose_from(anonymous, client):
    for job in ("alpha", "beta", "gamma"):
        init(client, job)
    html = anonymous.get(reverse("dashboard")).content.decode()
    assert re.findall(r'<option value="([^"]*)"', html) == ["gamma", "beta", "alpha"]


def test_page_selects_the_job_asked_for(anonymous, client):
    for job in ("alpha", "beta"):
        init(client, job)
    html = anonymous.get(reverse("dashboard"), {"job": "alpha"}).content.decode()
    assert 'data-job="alpha"' in html


def test_page_loads_nothing_from_outside_the_server(anonymous, client):
    init(client, "j")
    html = anonymous.get(reverse("dashboard")).content.decode()
    links = re.findall(r'(?:src|href)="([^"]*)"', html)
    assert links and all(link.startswith("/") and not link.startswith("//") for link in links)


def test_page_forbids_other_origins_by_content_security_policy(anonymous):
    policy = anonymous.get(reverse("dashboard"))["Content-Security-Policy"]
    assert "default-src 'none'" in policy and "http" not in policy


def test_page_and_data_never_show_the_token(anonymous, client, token, dynamic_round):
    page = anonymous.get(reverse("dashboard")).content.decode()
    data = json.dumps(board(anonymous))
    assert token not in page + data


def test_script_is_served_by_the_server(anonymous):
    response = anonymous.get(reverse("dashboard-asset", kwargs={"name": "dashboard.js"}))
    body = b"".join(response.streaming_content)
    assert response.status_code == 200 and b"textContent" in body


def test_other_files_are_not_served_as_assets(anonymous):
    response = anonymous.get(reverse("dashboard-asset", kwargs={"name": "views.py"}))
    assert response.status_code == 404


# -- the JSON -----------------------------------------------------------------------------------

def test_job_data_needs_no_token(anonymous, client):
    init(client, "j")
    assert anonymous.get(reverse("dashboard-job", kwargs={"job": "j"})).status_code == 200


def test_job_data_of_an_unknown_job_is_a_json_404(anonymous):
    response = anonymous.get(reverse("dashboard-job", kwargs={"job": "nope"}))
    assert response.status_code == 404 and response.json()["field"] == "job"


def test_job_list_names_every_job(anonymous, client):
    init(client, "a")
    init(client, "b", policy="planned")
    jobs = anonymous.get(reverse("dashboard-jobs")).json()["jobs"]
    assert {(j["name"], j["policy"]) for j in jobs} == {("a", "dynamic"), ("b", "planned")}


def test_k_of_the_last_closed_round_per_worker(client, dynamic_round):
    assert [w["k"] for w in board(client)["workers"]] == [2, 1]


def test_live_k_counts_this_rounds_reports_under_the_dynamic_policy(client, dynamic_round):
    assert [w["k_live"] for w in board(client)["workers"]] == [1, 0]


def test_slowest_worker_is_flagged(client, dynamic_round):
    assert [w["slowest"] for w in board(client)["workers"]] == [False, True]


def test_compute_share_splits_the_round_into_compute_and_wait(client, dynamic_round):
    assert [w["compute_share"] for w in board(client)["workers"]] == [0.4, 0.8]


def test_round_rate_is_closed_rounds_per_second(client, dynamic_round):
    assert board(client)["rounds_per_second"] == pytest.approx(4.0)


def test_requests_per_worker_are_counted(client, dynamic_round):
    assert [w["requests"] for w in board(client)["workers"]] == [4 + 1, 2 + 1]   # apply + reset


def test_recent_rounds_give_every_workers_k(client, dynamic_round):
    assert board(client)["recent_rounds"] == [{"round": 1, "k": [2, 1]}]


def test_planned_policy_shows_the_decided_k(client):
    init(client, "p", policy="planned")
    post(client, "job-plan", "p", {"r": 1, "c": 0.08})
    post(client, "job-plan", "p", {"r": 0, "c": 0.02})
    assert [w["k_live"] for w in board(client, "p")["workers"]] == [4, 1]


# -- hello: host and device ---------------------------------------------------------------------

def test_hello_shows_host_and_device_in_the_row(client):
    init(client, "j")
    post(client, "job-hello", "j", {"r": 1, "host": "cloud3", "device": "gpu0"})
    row = board(client)["workers"][1]
    assert (row["host"], row["device"]) == ("cloud3", "gpu0")


def test_hello_needs_the_token(anonymous, client):
    init(client, "j")
    response = post(anonymous, "job-hello", "j", {"r": 0, "host": "h", "device": "cpu0"})
    assert response.status_code == 401 and response.json()["error"] == ERR_TOKEN_MISSING


def test_hello_refuses_a_rank_outside_the_job(client):
    init(client, "j", workers=2)
    response = post(client, "job-hello", "j", {"r": 2, "host": "h", "device": "cpu0"})
    assert response.status_code == 400 and response.json()["error"] == ERR_HELLO_RANK.format(
        num_workers=2)


def test_hello_refuses_a_control_character_in_a_host_name(client):
    init(client, "j")
    response = post(client, "job-hello", "j", {"r": 0, "host": "cloud\n3", "device": "cpu0"})
    assert response.status_code == 400 and response.json()["error"] == ERR_HOST


# -- hello: the slow-down factor ----------------------------------------------------------------

def test_hello_shows_the_slowdown_factor_in_the_row(client):
    init(client, "j")
    post(client, "job-hello", "j", {"r": 1, "host": "h", "device": "cpu1", "slowdown": 6})
    workers = board(client)["workers"]
    assert workers[1]["slowdown"] == 6.0 and workers[0]["slowdown"] is None


def test_a_later_hello_shows_the_new_factor(client):
    init(client, "j")
    for factor in (1, 6):
        post(client, "job-hello", "j", {"r": 1, "host": "h", "device": "cpu1", "slowdown": factor})
    assert board(client)["workers"][1]["slowdown"] == 6.0


def test_hello_without_a_factor_leaves_it_unknown(client):
    init(client, "j")
    assert post(client, "job-hello", "j", {"r": 0, "host": "h", "device": "cpu0"}).status_code == 200
    assert board(client)["workers"][0]["slowdown"] is None


def test_service_stores_the_factor(client):
    init(client, "j")
    answer = dashboard_services.worker_hello(job="j", rank=0, host="h", device="cpu0",
                                             slowdown=2.5)
    assert answer["slowdown"] == 2.5
    assert Job.objects.get(name="j").worker_infos.get(rank=0).slowdown == 2.5


@pytest.mark.parametrize("bad", [0.5, 0, -3, "fast", "nan", "inf", True, 1e300, [6]])
def test_hello_refuses_a_bad_slowdown_naming_the_field(client, bad):
    init(client, "j")
    response = post(client, "job-hello", "j", {"r": 0, "host": "h", "device": "cpu0",
                                               "slowdown": bad})
    assert response.status_code == 400, response.content
    assert response.json()["field"] == "slowdown"
    assert board(client)["workers"][0]["slowdown"] is None


def test_slowdown_refused_by_the_service_names_the_field(client):
    init(client, "j")
    with pytest.raises(PolicyError) as caught:
        dashboard_services.worker_hello(job="j", rank=0, host="h", device="cpu0", slowdown=0.9)
    assert caught.value.field == "slowdown" and str(caught.value) == ERR_SLOWDOWN


def test_page_has_a_speed_column(anonymous, client):
    init(client, "j")
    page = anonymous.get(reverse("dashboard"), {"job": "j"}).content.decode()
    assert re.search(r"<th[^>]*>speed</th>", page)


# -- scores -------------------------------------------------------------------------------------

def test_scores_form_the_accuracy_curve_in_round_order(client):
    init(client, "j")
    for rnd, time, acc in [(20, 2.0, 0.7), (10, 1.0, 0.5)]:
        post(client, "job-scores", "j", {"round": rnd, "time": time, "accuracy": acc})
    assert board(client)["scores"] == [{"round": 10, "time": 1.0, "accuracy": 0.5},
                                       {"round": 20, "time": 2.0, "accuracy": 0.7}]


def test_scores_of_an_earlier_run_are_not_shown(client):
    init(client, "j")
    post(client, "job-scores", "j", {"round": 10, "time": 1.0, "accuracy": 0.5})
    init(client, "j")
    assert board(client)["scores"] == []


def test_scores_need_the_token(anonymous, client):
    init(client, "j")
    response = post(anonymous, "job-scores", "j", {"round": 1, "time": 1.0, "accuracy": 0.5})
    assert response.status_code == 401


def test_scores_refuse_an_accuracy_above_one(client):
    init(client, "j")
    response = post(client, "job-scores", "j", {"round": 1, "time": 1.0, "accuracy": 1.5})
    assert response.status_code == 400 and response.json()["error"] == ERR_ACCURACY


def test_scores_for_an_unknown_job_are_a_404(client):
    response = post(client, "job-scores", "nope", {"round": 1, "time": 1.0, "accuracy": 0.5})
    assert response.status_code == 404


def test_planned_round_reports_give_every_workers_k(client):
    init(client, "p", policy="planned")
    post(client, "job-rounds", "p", {"t": 1, "k": [1, 1], "c": [0.02, 0.08]})
    post(client, "job-rounds", "p", {"t": 2, "k": [4, 1], "c": [0.02, 0.08]})
    assert board(client, "p")["recent_rounds"] == [{"round": 1, "k": [1, 1]},
                                                   {"round": 2, "k": [4, 1]}]


def test_planned_round_reports_show_the_plan_as_live_k(client):
    init(client, "p", policy="planned")
    answer = post(client, "job-rounds", "p", {"t": 1, "k": [1, 1], "c": [0.02, 0.08]}).json()
    assert [w["k_live"] for w in board(client, "p")["workers"]] == answer["plan"]
