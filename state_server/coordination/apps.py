from django.apps import AppConfig


class CoordinationConfig(AppConfig):
    name = "coordination"
    default_auto_field = "django.db.models.BigAutoField"
