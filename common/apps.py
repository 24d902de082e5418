from django.apps import AppConfig


class CommonConfig(AppConfig):
    name = "common"

    def ready(self) -> None:
        from common.db import lookups  # noqa: F401  (registers `__any`)
