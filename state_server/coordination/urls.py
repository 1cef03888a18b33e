"""Routes: the original's paths on the job "default", /jobs/<job>/... on named jobs.

Every route also answers without its trailing slash (a POST cannot follow the redirect that
Django's APPEND_SLASH would send); the canonical, reversible form has the slash.
"""
from django.urls import path, re_path

from . import views

ACTIONS = [("init", views.init), ("apply", views.apply), ("plan", views.plan),
           ("reset", views.reset), ("history", views.history), ("rounds", views.rounds)]


def _route(route: str, view, name: str) -> list:
    """``route`` (ending in '/') by ``name``, and the same without the slash, unnamed."""
    regex = "^" + route[:-1].replace("<str:job>", "(?P<job>[^/]+)") + "$"
    return [path(route, view, name=name), re_path(regex, view)]


urlpatterns = [
    path("", views.home, name="state"),
    *_route("health/", views.health, "health"),
    *_route("jobs/", views.jobs, "jobs"),
    *_route("jobs/<str:job>/", views.state, "job-state"),
]
for _action, _view in ACTIONS:
    urlpatterns += _route(f"{_action}/", _view, _action)
    urlpatterns += _route(f"jobs/<str:job>/{_action}/", _view, f"job-{_action}")
