"""Schemathesis against the served OpenAPI schema, as every persona, on a longer budget.

    python -m bench.fuzz --examples 100 --json out.json
        [--negative 20] [--stateful 50] [--seed N] [--personas member,anonymous]
        [--url postgres://...]

Builds a fresh database (`--url`: PostgreSQL, or `sqlite:////tmp/fuzz.sqlite3` for the
embedded default, whose types differ: SQLite cannot bind an integer past 64 bits), the test
organisation (tests/conftest.py) with the personas below and a little of
everything (`populate`), and then, for each persona in turn, generates `--examples` requests
per operation (and `--negative` requests with invalid data) from `/api/v1/schema/`, then
`--stateful` sequences of calls chained by the links schemathesis infers, sends them
in-process through the WSGI application and checks every answer: no 5xx, a status code the
schema documents, the declared content type, a body that matches the declared schema; invalid
data refused with a 4xx; and for the anonymous visitor, no operation that needs credentials
answers anything but 401 or 403.

Random, not derandomized: the seed is printed and written to the JSON, and `--seed` replays a
run. The personas share the one database, in the order below, so a replay must keep the order.
The JSON reports per persona: operations, requests, 5xx, other failures, and each failing case
as a curl line (against http://localhost, the WSGI application's host).

tests/api/test_schema_fuzz.py runs the same `fuzz_persona` on a small derandomized budget.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import random
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/gantry_bench_fuzz"
BASE_URL = "http://localhost"
STEPS = 6  # calls per stateful sequence at most


@dataclass(frozen=True)
class Persona:
    label: str
    username: str | None  # None: anonymous, no credentials at all


PERSONAS = (
    Persona("member", "alice"),
    Persona("approver", "april"),
    Persona("team-admin", "tina"),
    Persona("department-admin", "dana"),
    Persona("finance", "carol"),
    Persona("platform-admin", "pat"),
    Persona("no-membership", "nobody"),
    Persona("node-agent", "node-agent:n-walk"),
    Persona("anonymous", None),
)


@dataclass
class Tally:
    """What one persona's fuzzing found. `failures`: one entry per failing request."""

    persona: str
    operations: int = 0
    requests: int = 0
    server_errors: int = 0
    other_failures: int = 0
    failures: list[dict[str, Any]] = field(default_factory=list)


def populate(org: Any) -> None:
    """The personas the isolation walks add (tests/isolation_personas.py), and a little of
    everything, so that lists and details answer with real rows."""
    from scheduler.models import GpuDevice
    from scheduler.services import job_submit
    from tenants.approval_policies import policy_set

    f, job_spec = _tests("factories"), _tests("conftest").job_spec
    _tests("isolation_personas").add_personas(org)
    for number in range(2):
        node = f.NodeFactory(name=f"h100-{number}")
        for index in range(2):
            GpuDevice.objects.create(node=node, index=index, model="H100-80GB", memory_mib=81920)
    spec = job_spec(replicas=1, resources={"gpus": 1, "cpu_milli": 1000, "memory_mib": 4096})
    job, _ = job_submit(user=org.users["alice"], project=org.proj_alpha, payload=spec)
    f.JobEventFactory(job=job, kind="note", actor=None, message="by the daemon")
    # A policy without a priority class sends the next job to approval: a request not decided.
    policy_set(user=org.users["tina"], tenant=org.alpha, rule="gpus_over", threshold=0)
    job_submit(user=org.users["alice"], project=org.proj_alpha, payload={**spec, "name": "big"})


def _tests(module: str) -> Any:
    """The tests' organisation and factories, imported by name: the tests' code is not part
    of what mypy checks, and would be if imported here by statement."""
    return importlib.import_module(f"tests.{module}")


def credentials(org: Any, persona: Persona) -> dict[str, str]:
    """The headers a persona's client sends: its DRF token, or nothing at all."""
    from rest_framework.authtoken.models import Token

    if persona.username is None:
        return {}
    token, _ = Token.objects.get_or_create(user=org.users[persona.username])
    return {"Authorization": f"Token {token.key}"}


def generous_rates(rest_framework: dict[str, Any]) -> dict[str, Any]:
    """REST_FRAMEWORK with every rate limit raised far above the fuzz's pace: at the product's
    rates a persona's later requests would meet 429 and never reach the code they are meant
    to test. The throttles still run, and 429 stays a documented answer."""
    rates = {scope: "1000000/min" for scope in rest_framework.get("DEFAULT_THROTTLE_RATES", {})}
    return {**rest_framework, "DEFAULT_THROTTLE_RATES": rates}


def served_schema() -> Any:
    import schemathesis
    from django.core.wsgi import get_wsgi_application

    return schemathesis.openapi.from_wsgi("/api/v1/schema/", get_wsgi_application())


def refused_without_credentials(ctx: Any, response: Any, case: Any) -> bool | None:
    """An operation whose schema asks for credentials answers a valid request without any
    with 401 or 403, never with data nor with a 400 that shows the request was read. An
    invalid one may also meet a 4xx from before authentication (a path that matches no
    route is 404), never a success."""
    from schemathesis.core.failures import Failure

    if response.request.headers.get("Authorization") or {} in _security(case):
        return None
    negative = case.meta is not None and case.meta.generation.mode.is_negative
    refused = response.status_code >= 400 if negative else response.status_code in (401, 403)
    if not refused:
        raise Failure(
            operation=case.operation.label,
            title="Answered without credentials",
            message=f"{response.status_code} to a request without credentials; expected 401 or 403",
        )
    return True


def _security(case: Any) -> list[dict[str, Any]]:
    definition = case.operation.definition.raw
    # No `security` on the operation and none at the top level: anyone may call it.
    return definition.get("security", case.operation.schema.raw_schema.get("security", [{}]))


def checks_for(persona: Persona, *, negative: bool) -> list[Callable[..., Any]]:
    from schemathesis.checks import not_a_server_error
    from schemathesis.specs.openapi.checks import (
        content_type_conformance,
        negative_data_rejection,
        response_schema_conformance,
        status_code_conformance,
    )

    checks: list[Callable[..., Any]] = [
        not_a_server_error,
        status_code_conformance,
        content_type_conformance,
        response_schema_conformance,
    ]
    if negative:
        checks.append(negative_data_rejection)
    if persona.username is None:
        checks.append(refused_without_credentials)
    return checks


def fuzz_persona(
    schema: Any,
    *,
    persona: Persona,
    headers: dict[str, str],
    examples: int,
    negative: int = 0,
    stateful: int = 0,
    seed: int | None = None,
) -> Tally:
    """`examples` valid and `negative` invalid requests per operation, then `stateful`
    sequences of linked calls, each answer checked.
    `seed` None: derandomized (the same requests on every run); otherwise random from `seed`,
    each operation from its own seed derived from it, so that one operation replays alone."""
    from schemathesis import GenerationMode

    tally = Tally(persona=persona.label)
    for result in schema.get_all_operations():
        operation = result.ok()
        tally.operations += 1
        for mode, budget in (
            (GenerationMode.POSITIVE, examples),
            (GenerationMode.NEGATIVE, negative),
        ):
            if budget:
                _fuzz_operation(operation, persona, headers, mode, budget, seed, tally)
    if stateful:
        _fuzz_stateful(schema, persona, headers, stateful, tally)
    return tally


def _settings(budget: int, *, derandomize: bool, **extra: Any) -> Any:
    """No shrinking: every failing request is recorded as it was sent, and the run goes on."""
    from hypothesis import HealthCheck, Phase, settings

    return settings(
        max_examples=budget,
        deadline=None,
        derandomize=derandomize,
        database=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
        **extra,
    )


def _fuzz_operation(
    operation: Any,
    persona: Persona,
    headers: dict[str, str],
    mode: Any,
    budget: int,
    seed: int | None,
    tally: Tally,
) -> None:
    import hypothesis
    from hypothesis import given

    checks = checks_for(persona, negative=mode.is_negative)

    @_settings(budget, derandomize=seed is None)
    @given(case=operation.as_strategy(generation_mode=mode))
    def call(case: Any) -> None:
        _check(tally, mode.value, case, case.call(headers=headers), checks, headers)

    if seed is not None:
        call = hypothesis.seed(seed ^ zlib.crc32(f"{operation.label} {mode.value}".encode()))(call)
    with contextlib.suppress(hypothesis.errors.Unsatisfiable):
        call()  # Unsatisfiable: nothing to negate in this operation (no parameters, no body)


def _fuzz_stateful(
    schema: Any, persona: Persona, headers: dict[str, str], scenarios: int, tally: Tally
) -> None:
    """Sequences of calls chained by the links schemathesis infers from the schema (a job's id
    from `POST /jobs/` or `GET /jobs/` into `GET /jobs/{id}/`, `cancel`, ...), so that details
    and actions meet rows that exist. Derandomized even in the benchmark: a state machine run
    this way takes no seed."""
    checks = checks_for(persona, negative=False)

    class Machine(schema.as_state_machine()):  # type: ignore[misc]
        def get_call_kwargs(self, case: Any) -> dict[str, Any]:
            return {"headers": headers}

        def validate_response(self, response: Any, case: Any, *_: Any, **__: Any) -> None:
            _check(tally, "stateful", case, response, checks, headers)

    Machine.run(settings=_settings(scenarios, derandomize=True, stateful_step_count=STEPS))


def _check(
    tally: Tally,
    mode: str,
    case: Any,
    response: Any,
    checks: list[Callable[..., Any]],
    headers: dict[str, str],
) -> None:
    """Count the request; record it as a failure, reproducibly, if a check fails."""
    from schemathesis.core.failures import FailureGroup

    tally.requests += 1
    try:
        case.validate_response(response, checks=checks, headers=headers)
    except FailureGroup as group:
        if response.status_code >= 500:
            tally.server_errors += 1
        else:
            tally.other_failures += 1
        tally.failures.append(
            {
                "operation": case.operation.label,
                "mode": mode,
                "status": response.status_code,
                "checks": sorted({failure.title for failure in group.exceptions}),
                "message": "; ".join(f.message[:300] for f in group.exceptions),
                "curl": case.as_curl_command(headers=headers, base_url=BASE_URL),
                "body": response.text[:500],
            }
        )


def run(
    url: str,
    *,
    examples: int,
    negative: int,
    stateful: int,
    seed: int,
    personas: Sequence[Persona],
) -> dict[str, Any]:
    from bench.daemon_setup import fresh_database

    if url.startswith("sqlite:///"):
        Path(url.removeprefix("sqlite:///")).unlink(missing_ok=True)
        # fresh_database's settings, on a file that migrate creates.
        os.environ.update(DATABASE_URL=url, DJANGO_SETTINGS_MODULE="config.settings")
        os.environ.setdefault("DJANGO_DEBUG", "0")
        import django
        from django.core.management import call_command

        django.setup()
        call_command("migrate", verbosity=0)
    else:
        fresh_database(url)
    return run_here(
        examples=examples, negative=negative, stateful=stateful, seed=seed, personas=personas
    )


def run_here(
    *,
    examples: int,
    negative: int,
    stateful: int,
    seed: int,
    personas: Sequence[Persona] = PERSONAS,
) -> dict[str, Any]:
    """On the database Django is set up with (the benchmark's fresh one, or a test's)."""
    from django.conf import settings
    from django.test import override_settings

    with override_settings(REST_FRAMEWORK=generous_rates(settings.REST_FRAMEWORK)):
        return _run_personas(
            examples=examples, negative=negative, stateful=stateful, seed=seed, personas=personas
        )


def _run_personas(
    *, examples: int, negative: int, stateful: int, seed: int, personas: Sequence[Persona]
) -> dict[str, Any]:
    from django.core.cache import cache

    org = _tests("conftest").build_org()
    populate(org)
    schema = served_schema()
    started = time.perf_counter()
    tallies = []
    for persona in personas:
        cache.clear()  # throttles and login guards count per persona, from zero
        tallies.append(
            fuzz_persona(
                schema,
                persona=persona,
                headers=credentials(org, persona),
                examples=examples,
                negative=negative,
                stateful=stateful,
                seed=seed,
            )
        )
    return {
        "seed": seed,
        "examples": examples,
        "negative": negative,
        "stateful": stateful,
        "seconds": round(time.perf_counter() - started, 1),
        "personas": {tally.persona: asdict(tally) for tally in tallies},
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Fuzz the API as every persona")
    parser.add_argument("--examples", type=int, default=100, help="valid requests per operation")
    parser.add_argument("--negative", type=int, default=20, help="invalid requests per operation")
    parser.add_argument("--stateful", type=int, default=50, help="sequences of linked calls")
    parser.add_argument("--seed", type=int, default=None, help="replay a run (default: random)")
    parser.add_argument("--personas", default="", help="comma-separated labels (default: all)")
    parser.add_argument("--url", default=os.environ.get("GANTRY_BENCH_URL", DEFAULT_URL))
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**32)
    print(f"seed {seed}", flush=True)
    wanted = set(filter(None, args.personas.split(",")))
    personas = [p for p in PERSONAS if not wanted or p.label in wanted]
    result = run(
        args.url,
        examples=args.examples,
        negative=args.negative,
        stateful=args.stateful,
        seed=seed,
        personas=personas,
    )
    for label, tally in result["personas"].items():
        print(
            f"{label:18} operations {tally['operations']:4} requests {tally['requests']:6} "
            f"5xx {tally['server_errors']:4} other failures {tally['other_failures']:4}"
        )
        for failure in tally["failures"]:
            print(f"  {failure['status']} {failure['operation']} {failure['checks']}")
            print(f"    {failure['curl']}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
