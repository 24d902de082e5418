"""Domain errors raised by services; the API maps them to 4xx answers."""


class DomainError(Exception):
    """A request that breaks a business rule (400)."""


class ConflictError(DomainError):
    """A request that conflicts with the current state (409), e.g. a lost state transition."""
