"""Domain errors raised by services; the API maps them to 4xx answers."""


class DomainError(Exception):
    """A request that breaks a business rule (400)."""


class ConflictError(DomainError):
    """A request that conflicts with the current state (409), e.g. a lost state transition."""


class RateLimitedError(DomainError):
    """A request past an allowance (429): `retry_after_s` says in how many seconds the same
    request would be taken (the API's Retry-After header)."""

    def __init__(self, message: str, *, retry_after_s: int) -> None:
        super().__init__(message)
        self.retry_after_s = max(int(retry_after_s), 1)
