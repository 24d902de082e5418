"""Django project wiring. Imported by nobody but Django, Celery and WSGI."""

from config.celery import app as celery_app

__all__ = ("celery_app",)
