"""Schemathesis against the served OpenAPI schema, as every persona, every check, every phase.

    python -m bench.fuzz --examples 20 --json out.json
        [--phases examples,coverage,fuzzing,stateful] [--debug both|on|off] [--seed N]
        [--personas member,anonymous] [--url postgres://...]

Builds a fresh database (`--url`: PostgreSQL, or `sqlite:////tmp/fuzz.sqlite3` for the
embedded default), the test organisation (tests/conftest.py) with the personas below and an
object of every kind (`populate`: jobs and their events, approval requests, what-if runs,
metered usage, a closed statement with an adjustment, budgets, cost exports, policies), and
then, for each persona in turn, runs schemathesis's engine (the CLI's `st run`) in process
through the WSGI application: the examples, coverage (boundary values, every undocumented
method OPTIONS included, missing and malformed parameters), fuzzing and stateful phases,
valid and invalid data, with every check the installed schemathesis has (no 5xx, documented
status codes, content types, headers and bodies, invalid data refused and valid accepted,
`Allow` on 405 and OPTIONS, auth ignored, a deleted resource gone, ...), plus our own: an
anonymous request to an operation that needs credentials answers 401 or 403.
`--debug both` (the default) runs it all twice, with DEBUG off as deployed and on as
`make run` serves it.

`--seed` replays a run (the default is a random seed, printed and written to the JSON); the
personas share the one database, in the order below, so a replay keeps the order. The JSON
has per DEBUG value and persona: operations, requests, 5xx, other failures, engine errors,
and each failing request as a curl line (against http://localhost, the WSGI application's
host).

tests/api/test_schema_fuzz.py runs the same `fuzz_persona` on a small deterministic budget.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import random
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.fuzz.checks import refused_without_credentials, valid_data_accepted

DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/gantry_bench_fuzz"
BASE_URL = "http://localhost"
STEPS = 6  # calls per stateful sequence at most
PHASES = ("examples", "coverage", "fuzzing", "stateful")
# Operations that spend the caller's own credential: after `rotate` the persona's token is
# gone and every later request is refused, so an authenticated persona does not fuzz them
# (the anonymous visitor does; tests/api/test_token_expiry.py covers what they do).
SPENDS_CREDENTIALS = ("/api/v1/auth/token/rotate/",)
# Registered with schemathesis on import; every run applies them.
CHECKS = (refused_without_credentials, valid_data_accepted)
# Every method the schema may leave out of a path: the coverage phase sends each one the path
# does not document and expects 405 with `Allow` (OPTIONS: an answer whose `Allow` matches).
UNEXPECTED = ["get", "put", "post", "delete", "options", "patch", "trace"]


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
    successes: int = 0  # 2xx: a persona refused everywhere (a spent token) fuzzes nothing
    server_errors: int = 0
    other_failures: int = 0
    failures: list[dict[str, Any]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # the engine's own (a schema it cannot use)
    seconds: float = 0.0


def populate(org: Any) -> None:
    """The personas the isolation walks add (tests/isolation_personas.py), and a little of
    everything, so that lists and details answer with real rows."""
    from scheduler.jobs.services import job_submit
    from scheduler.models import GpuDevice
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
    _populate_every_kind(org)


def _populate_every_kind(org: Any) -> None:
    """What the isolation walk gives every team (jobs, events, priority defaults, quota
    requests, audit entries, what-if runs, metered usage, budgets, cost exports, a closed
    statement), an adjustment on the statement, and a what-if run that failed."""
    from datetime import timedelta
    from decimal import Decimal

    from django.utils import timezone

    from billing.statements.closing import statement_adjust
    from whatif.models import WhatIf, WhatIfState

    walk = _tests("api.test_isolation_walk")
    walk.populate(org)
    statement = walk.populate_billing(org)
    statement_adjust(
        user=org.users["carol"],
        statement=statement,
        tenant=org.alpha,
        amount=Decimal("-1.50"),
        reason="a faulty node",
    )
    now = timezone.now()
    WhatIf.objects.create(
        requested_by=org.users["tina"],
        scope=org.alpha,
        state=WhatIfState.FAILED,
        error="the replay failed",
        created_at=now,
        expires_at=now + timedelta(days=7),
    )


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
    """The raw OpenAPI document the API serves (loaded once: every persona fuzzes it)."""
    from django.test import Client

    response = Client(HTTP_HOST="localhost").get("/api/v1/schema/", HTTP_ACCEPT="application/json")
    assert response.status_code == 200, response.content[:300]
    return json.loads(response.content)


def engine_config(
    *,
    headers: dict[str, str],
    examples: int,
    phases: Sequence[str] = PHASES,
    seed: int | None = None,
    steps: int = STEPS,
) -> Any:
    """Schemathesis's configuration for one persona: every check (each one the installed
    version has, `max_response_time` aside: it needs a limit, and timing is not what this
    measures; `positive_data_acceptance` as `valid_data_accepted`; ours in bench.fuzz.checks),
    the given phases, valid and invalid data (`mode: all`), `examples` cases per
    operation and phase, every undocumented method in the coverage phase (OPTIONS and TRACE
    included). `seed` None: deterministic, the same requests on every run. One worker: the
    engine's thread is the only one that touches the database besides the caller's."""
    from schemathesis.config import SchemathesisConfig

    data: dict[str, Any] = {
        "workers": 1,
        "continue-on-failure": True,
        "suppress-health-check": ["all"],
        "cache": {"enabled": False},  # nothing written under .schemathesis/
        # The token as the schema's `tokenAuth` scheme, not a plain header: the `ignored_auth`
        # check then knows which credential to leave out or spoil.
        "auth": {"openapi": {"tokenAuth": {"api_key": headers["Authorization"]}}}
        if "Authorization" in headers
        else {},
        "operations": [{"include-path": path, "enabled": False} for path in SPENDS_CREDENTIALS]
        if "Authorization" in headers
        else [],
        "checks": {"enabled": True, "positive_data_acceptance": {"enabled": False}},
        "phases": {
            **{phase: {"enabled": phase in phases} for phase in PHASES},
            "coverage": {"enabled": "coverage" in phases, "unexpected-methods": UNEXPECTED},
            "stateful": {"enabled": "stateful" in phases, "max-steps": steps},
        },
        "generation": {
            "mode": "all",
            "max-examples": examples,
            "deterministic": seed is None,
            "database": "none",
            "no-shrink": True,
        },
    }
    if seed is not None:
        data["seed"] = seed
    return SchemathesisConfig.from_dict(data)


@contextlib.contextmanager
def serving() -> Iterator[str]:
    """The WSGI application on a local port, in a thread of its own, as `make run` serves it:
    schemathesis's engine then calls it over HTTP as its CLI does. The thread reads the
    database through its own connection, so it sees committed rows only."""
    from wsgiref.simple_server import WSGIRequestHandler, make_server

    from django.core.wsgi import get_wsgi_application
    from django.db import connections

    class Quiet(WSGIRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = make_server("127.0.0.1", 0, get_wsgi_application(), handler_class=Quiet)

    def serve() -> None:
        try:
            server.serve_forever(poll_interval=0.05)
        finally:
            connections.close_all()  # this thread's, before the database goes away

    thread = threading.Thread(target=serve, name="fuzz-server", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        thread.join()
        server.server_close()


def fuzz_persona(
    raw_schema: dict[str, Any],
    *,
    base_url: str,
    persona: Persona,
    headers: dict[str, str],
    examples: int,
    phases: Sequence[str] = PHASES,
    seed: int | None = None,
    steps: int = STEPS,
) -> Tally:
    """Run schemathesis's engine over every operation as `persona` against `base_url`
    (`serving()`), and count what it sent and what failed."""
    import schemathesis
    from schemathesis.engine import events

    config = engine_config(
        headers=headers, examples=examples, phases=phases, seed=seed, steps=steps
    )
    config.projects.default.update(base_url=base_url)
    schema = schemathesis.openapi.from_dict(raw_schema, config=config)
    tally = Tally(persona=persona.label)
    started = time.perf_counter()
    labels: set[str] = set()
    for event in schemathesis.engine.from_schema(schema).execute():
        if isinstance(event, events.ScenarioFinished):
            _record(tally, event.phase.value, event.recorder, headers)
            labels.add(event.recorder.label)
        elif isinstance(event, events.NonFatalError):
            tally.errors.append(f"{event.label}: {event.info.message[:300]}")
        elif isinstance(event, events.FatalError):
            tally.errors.append(repr(event.exception)[:300])
    tally.operations = len({label for label in labels if label.split(" ")[0].isupper()})
    tally.seconds = round(time.perf_counter() - started, 1)
    return tally


def _record(tally: Tally, phase: str, recorder: Any, headers: dict[str, str]) -> None:
    """Count each request; record each failing one, reproducibly (a curl line)."""
    for interaction in recorder.interactions.values():
        tally.requests += 1
        status = interaction.response.status_code if interaction.response is not None else 0
        tally.successes += 200 <= status < 300
        tally.server_errors += status >= 500
    for case_id, checks in recorder.checks.items():
        failed = [check for check in checks if check.failure_info is not None]
        if not failed:
            continue
        interaction = recorder.interactions.get(case_id)
        response = interaction.response if interaction is not None else None
        status = response.status_code if response is not None else 0
        if status < 500:
            tally.other_failures += 1
        case = recorder.cases[case_id].value
        tally.failures.append(
            {
                "operation": case.operation.label,
                "phase": phase,
                "status": status,
                "checks": sorted({check.name for check in failed}),
                "message": "; ".join(
                    check.failure_info.failure.title
                    + ": "
                    + check.failure_info.failure.message[:300]
                    for check in failed
                ),
                "curl": case.as_curl_command(headers=headers, base_url=BASE_URL),
                "body": response.content[:500].decode(errors="replace") if response else "",
            }
        )


def run(
    url: str,
    *,
    examples: int,
    phases: Sequence[str],
    debug: Sequence[bool],
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
    return run_here(examples=examples, phases=phases, debug=debug, seed=seed, personas=personas)


def run_here(
    *,
    examples: int,
    phases: Sequence[str] | dict[str, Sequence[str]] = PHASES,
    default_phases: Sequence[str] = PHASES,
    debug: Sequence[bool] = (False, True),
    seed: int | None = None,
    personas: Sequence[Persona] = PERSONAS,
) -> dict[str, Any]:
    """On the database Django is set up with (the benchmark's fresh one, or a test's, whose
    rows the engine's thread must see: committed, a transactional test). `phases`: for every
    persona, or per persona label (the others get `default_phases`)."""
    from django.conf import settings
    from django.core.cache import cache
    from django.test import override_settings

    org = _tests("conftest").build_org()
    populate(org)
    raw = served_schema()
    started = time.perf_counter()
    runs: dict[str, Any] = {}
    rest_framework = generous_rates(settings.REST_FRAMEWORK)
    for value in debug:
        tallies = {}
        with override_settings(DEBUG=value, REST_FRAMEWORK=rest_framework), serving() as url:
            for persona in personas:
                cache.clear()  # throttles and login guards count per persona, from zero
                tally = fuzz_persona(
                    raw,
                    base_url=url,
                    persona=persona,
                    headers=credentials(org, persona),
                    examples=examples,
                    phases=(
                        phases.get(persona.label, default_phases)
                        if isinstance(phases, dict)
                        else phases
                    ),
                    seed=seed,
                )
                tallies[persona.label] = asdict(tally)
        runs["debug-on" if value else "debug-off"] = tallies
    return {
        "seed": seed,
        "examples": examples,
        "phases": phases if isinstance(phases, dict) else list(phases),
        "seconds": round(time.perf_counter() - started, 1),
        "runs": runs,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Fuzz the API as every persona")
    parser.add_argument("--examples", type=int, default=20, help="cases per operation and phase")
    parser.add_argument("--phases", default=",".join(PHASES))
    parser.add_argument("--debug", choices=["both", "on", "off"], default="both")
    parser.add_argument("--seed", type=int, default=None, help="replay a run (default: random)")
    parser.add_argument("--personas", default="", help="comma-separated labels (default: all)")
    parser.add_argument("--url", default=os.environ.get("GANTRY_BENCH_URL", DEFAULT_URL))
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**32)
    print(f"seed {seed}", flush=True)
    wanted = set(filter(None, args.personas.split(",")))
    result = run(
        args.url,
        examples=args.examples,
        phases=[phase for phase in args.phases.split(",") if phase],
        debug={"both": (False, True), "on": (True,), "off": (False,)}[args.debug],
        seed=seed,
        personas=[p for p in PERSONAS if not wanted or p.label in wanted],
    )
    for run_name, tallies in result["runs"].items():
        for label, tally in tallies.items():
            print(
                f"{run_name:9} {label:18} operations {tally['operations']:4} "
                f"requests {tally['requests']:6} 2xx {tally['successes']:5} "
                f"5xx {tally['server_errors']:4} "
                f"other failures {tally['other_failures']:4} errors {len(tally['errors'])}"
            )
            for failure in tally["failures"]:
                print(f"  {failure['status']} {failure['operation']} {failure['checks']}")
                print(f"    {failure['message'][:300]}")
                print(f"    {failure['curl'][:400]}")
            for error in tally["errors"]:
                print(f"  error: {error}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
