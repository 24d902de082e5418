"""Finance exports: CSV, XLSX and FOCUS, large ones as Celery work."""
