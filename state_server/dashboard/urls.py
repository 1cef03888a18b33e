"""``/dashboard/`` (page, assets, JSON) and the calls that feed it, ``/jobs/<job>/hello|scores/``."""
from django.urls import path

from coordination.urls import _route

from . import views

urlpatterns = [
    path("dashboard/", views.page, name="dashboard"),
    path("dashboard/static/<str:name>", views.asset, name="dashboard-asset"),
    path("dashboard/api/jobs/", views.jobs, name="dashboard-jobs"),
    path("dashboard/api/jobs/<str:job>/", views.job, name="dashboard-job"),
    *_route("jobs/<str:job>/hello/", views.hello, "job-hello"),
    *_route("jobs/<str:job>/scores/", views.scores, "job-scores"),
]
