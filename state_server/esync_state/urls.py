"""Root URLs: the coordination API at the root (the original's paths), the dashboard, JSON errors."""
from django.urls import include, path

urlpatterns = [path("", include("coordination.urls")), path("", include("dashboard.urls"))]

handler400 = "coordination.views.bad_request"
handler403 = "coordination.views.forbidden"
handler404 = "coordination.views.not_found"
handler500 = "coordination.views.server_error"
