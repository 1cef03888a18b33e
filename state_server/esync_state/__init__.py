"""Django project of the ESync state server (settings, URLs, WSGI entry point)."""
