from django.apps import AppConfig


class SchedulerConfig(AppConfig):
    name = "scheduler"

    def ready(self) -> None:
        # Approval requests of jobs are settled by the scheduler (tenants cannot import it).
        from scheduler import approvals

        approvals.register()
