"""Settings, all from the environment.

With no DATABASE_URL / REDIS_URL the embedded default applies: SQLite under `var/` and a
filesystem Celery broker, so one machine runs everything without services. Every variable is
documented in README.md.
"""

import contextlib
import ipaddress
import os
from pathlib import Path

import dj_database_url
from kombu import Exchange, Queue

from common.releases.version import gantry_version

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(os.environ.get("GANTRY_VAR_DIR", BASE_DIR / "var"))


def env_bool(name: str, default: bool = False) -> bool:
    value = os.environ.get(name)
    if value is None:
        return default
    return value.strip().lower() in {"1", "true", "yes", "on"}


def env_list(name: str, default: str = "") -> list[str]:
    return [item.strip() for item in os.environ.get(name, default).split(",") if item.strip()]


PRODUCTION = env_bool("GANTRY_PRODUCTION")
DEBUG = env_bool("DJANGO_DEBUG", default=not PRODUCTION)

_DEV_SECRET = "gantry-dev-only-secret-key-not-for-production-use-0123456789abcdef"
SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "" if PRODUCTION else _DEV_SECRET)
if PRODUCTION and not SECRET_KEY:
    raise RuntimeError("DJANGO_SECRET_KEY must be set when GANTRY_PRODUCTION=1")

ALLOWED_HOSTS = env_list("DJANGO_ALLOWED_HOSTS", "" if PRODUCTION else "localhost,127.0.0.1,[::1]")
CSRF_TRUSTED_ORIGINS = env_list("DJANGO_CSRF_TRUSTED_ORIGINS")

INSTALLED_APPS = [
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "rest_framework.authtoken",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_htmx",
    "common",
    "tenants",
    "scheduler",
    "billing",
    "whatif",
    "capacity",
    "portal",
]

MIDDLEWARE = [
    # First: the API's error shape under /api/ whatever DEBUG says, and DEBUG's technical pages
    # for loopback clients only (common/middleware.py).
    "common.middleware.ErrorPagesMiddleware",
    "common.middleware.BodySizeLimitMiddleware",
    "common.middleware.ContentSecurityPolicyMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
]

ROOT_URLCONF = "config.urls"
WSGI_APPLICATION = "config.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASES = {
    "default": dj_database_url.config(
        env="DATABASE_URL",
        default=f"sqlite:///{VAR_DIR / 'gantry.sqlite3'}",
        conn_max_age=int(os.environ.get("GANTRY_DB_CONN_MAX_AGE", "60")),
        conn_health_checks=True,
    )
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
    # Bound every statement so a stuck lock or query never hangs a request or the daemon.
    # No JIT: Gantry's queries are short, and the planner's over-estimates of the queue
    # queries crossed jit_above_cost, compiling code for longer than the query ran, each cycle
    # (bench/history.md, kueue_e2e, 2026-12-02 13:18-14:05).
    DATABASES["default"].setdefault("OPTIONS", {})["options"] = (
        f"-c lock_timeout={os.environ.get('GANTRY_DB_LOCK_TIMEOUT_MS', '5000')}"
        f" -c statement_timeout={os.environ.get('GANTRY_DB_STATEMENT_TIMEOUT_MS', '30000')}"
        f" -c jit={os.environ.get('GANTRY_DB_JIT', 'off')}"
    )
    # Parameters bound by the server (psycopg's Cursor, not ClientCursor): values go apart
    # from the SQL text instead of being quoted into it in Python, which cost the daemon
    # CPU (its id arrays above all; bench/history.md, kueue_e2e, 2026-12-03 13:41-16:40).
    # And a statement run five times on a connection is prepared (psycopg's
    # prepare_threshold; Django's default is never): the daemon runs the same statements
    # every cycle, which PostgreSQL then does not parse again (bench/results.md,
    # daemon_drain, 2026-12-05). Always planned for its values (plan_cache_mode): a generic
    # plan cannot use the partial indexes on `state` (`state = $1`), and PostgreSQL may keep
    # one chosen while the table was small as it grows (a scan of every job ever run). The
    # daemon's own sessions let PostgreSQL weigh a generic plan instead, for the few
    # statements it runs every cycle (`scheduler.leader.DAEMON_PLAN_CACHE_MODE`). Turn
    # both off behind a pooler that rejects the extended protocol's binds or cannot keep
    # prepared statements.
    binding = env_bool("GANTRY_DB_SERVER_SIDE_BINDING", default=True)
    DATABASES["default"]["OPTIONS"]["server_side_binding"] = binding
    DATABASES["default"]["OPTIONS"]["prepare_threshold"] = 5 if binding else None
    if binding:
        DATABASES["default"]["OPTIONS"]["options"] += " -c plan_cache_mode=force_custom_plan"
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    VAR_DIR.mkdir(parents=True, exist_ok=True)
    # WAL lets the web, daemon and worker processes read while one of them writes.
    DATABASES["default"].setdefault("OPTIONS", {})["init_command"] = "PRAGMA journal_mode=WAL;"
    DATABASES["default"]["OPTIONS"]["transaction_mode"] = "IMMEDIATE"
    # Writers wait for each other this long (seconds) before "database is locked".
    DATABASES["default"]["OPTIONS"]["timeout"] = float(
        os.environ.get("GANTRY_SQLITE_TIMEOUT_S", "20")
    )
    # The test database is a file, as `make run`'s is: an in-memory database shares one cache
    # between connections and answers concurrent writers with "database table is locked"
    # at once instead of waiting, which is not how the product behaves.
    DATABASES["default"]["TEST"] = {"NAME": str(VAR_DIR / "test.sqlite3")}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/accounts/login/"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "/static/"
STATIC_ROOT = Path(os.environ.get("GANTRY_STATIC_ROOT", BASE_DIR / "staticfiles"))
WHITENOISE_USE_FINDERS = DEBUG
STATICFILES_FINDERS = [
    "django.contrib.staticfiles.finders.FileSystemFinder",
    "django.contrib.staticfiles.finders.AppDirectoriesFinder",
    # plotly.js from the installed plotly package (portal/staticfinders.py): no CDN, no copy.
    "portal.staticfinders.PlotlyFinder",
]
# whitenoise warns when the folder is missing; collectstatic fills it in production.
with contextlib.suppress(OSError):
    STATIC_ROOT.mkdir(parents=True, exist_ok=True)
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": (
            "whitenoise.storage.CompressedManifestStaticFilesStorage"
            if PRODUCTION
            else "django.contrib.staticfiles.storage.StaticFilesStorage"
        )
    },
}

# Request size: anything above this is refused with 413 before it is read.
GANTRY_MAX_BODY_BYTES = int(os.environ.get("GANTRY_MAX_BODY_BYTES", str(256 * 1024)))
DATA_UPLOAD_MAX_MEMORY_SIZE = GANTRY_MAX_BODY_BYTES
DATA_UPLOAD_MAX_NUMBER_FIELDS = 1000

_RENDERERS = ["rest_framework.renderers.JSONRenderer"]
if DEBUG:
    _RENDERERS.append("rest_framework.renderers.BrowsableAPIRenderer")
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "rest_framework.authentication.SessionAuthentication",
        # DRF's tokens, refused once older than GANTRY_TOKEN_LIFETIME_DAYS (common/api/tokens.py).
        "common.api.tokens.ExpiringTokenAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["scheduler.api.permissions.PeopleOnly"],
    "DEFAULT_PARSER_CLASSES": ["common.api.parsers.BoundedJSONParser"],
    "DEFAULT_RENDERER_CLASSES": _RENDERERS,
    "DEFAULT_PAGINATION_CLASS": "common.api.pagination.StrictPageNumberPagination",
    "PAGE_SIZE": 50,
    "DEFAULT_FILTER_BACKENDS": ["common.api.filters.StrictFilterBackend"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "common.api.errors.exception_handler",
    # Rate limits (common/api/throttles.py): per user, per token, anonymous per address;
    # submissions and node agents' reports in scopes of their own. Defaults far above what the
    # portal and the CLI send, so that only a runaway client meets them.
    "DEFAULT_THROTTLE_CLASSES": [
        "common.api.throttles.UserThrottle",
        "common.api.throttles.TokenThrottle",
        "common.api.throttles.AnonymousThrottle",
    ],
    "DEFAULT_THROTTLE_RATES": {
        "user": os.environ.get("GANTRY_THROTTLE_USER", "1200/min"),
        "token": os.environ.get("GANTRY_THROTTLE_TOKEN", "600/min"),
        "anon": os.environ.get("GANTRY_THROTTLE_ANON", "60/min"),
        "submit": os.environ.get("GANTRY_THROTTLE_SUBMIT", "120/min"),
        "agent": os.environ.get("GANTRY_THROTTLE_AGENT", "60/min"),
        # Attempts at the token endpoint per client address (the login guard's counters bound
        # guessing per account; this bounds one client's attempts over every account).
        "login": os.environ.get("GANTRY_THROTTLE_LOGIN", "20/min"),
    },
    "DEFAULT_CONTENT_NEGOTIATION_CLASS": "common.api.negotiation.StrictContentNegotiation",
    "DEFAULT_METADATA_CLASS": "common.api.metadata.DescriptiveMetadata",
}

SPECTACULAR_SETTINGS = {
    "TITLE": "Gantry API",
    "DESCRIPTION": "Multi-tenant GPU scheduling: tenants, quotas, priority classes and jobs.",
    "VERSION": gantry_version(),  # the release the schema describes (docs/releasing.md)
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "common.api.schema.add_error_responses",
    ],
    "ENUM_NAME_OVERRIDES": {
        "TenantKindEnum": "tenants.models.TenantKind",
        "FlavorKindEnum": "tenants.models.FlavorKind",
        "LineKindEnum": "billing.models.LineKind",
        "WhatIfStateEnum": "whatif.models.WhatIfState",
        "IdleActionEnum": "tenants.models.IdleAction",
    },
}

REDIS_URL = os.environ.get("REDIS_URL", "")
if REDIS_URL:
    CELERY_BROKER_URL = REDIS_URL
    from common.cache import redis_caches

    # Unreachable Redis reads as "not cached", never as a failed request (common/cache.py).
    CACHES = redis_caches(REDIS_URL)
else:
    # Embedded default: a broker on the local filesystem shared by web and worker processes.
    _broker_dir = VAR_DIR / "broker"
    CELERY_BROKER_URL = "filesystem://"
    # kombu's filesystem transport, but a message is renamed into the queue once written
    # whole: a worker reading it half-written died (common/filesystem_broker.py).
    CELERY_BROKER_TRANSPORT = "common.filesystem_broker:Transport"
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(_broker_dir / "queue"),
        "data_folder_out": str(_broker_dir / "queue"),
        "processed_folder": str(_broker_dir / "processed"),
        "control_folder": str(_broker_dir / "control"),
        "store_processed": False,
    }
    CACHES = {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
        # Files, not process memory: the web server's processes must count one window.
        "throttle": {
            "BACKEND": "django.core.cache.backends.filebased.FileBasedCache",
            "LOCATION": str(VAR_DIR / "throttle"),
            # Past MAX_ENTRIES the cache deletes a third of its files, and a window deleted
            # forgets its counts: room for a few windows (user, token, submit) per active user.
            "OPTIONS": {"MAX_ENTRIES": 5000},
        },
    }
    for _folder in ("queue", "processed", "control"):
        with contextlib.suppress(OSError):
            (_broker_dir / _folder).mkdir(parents=True, exist_ok=True)
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_ACKS_LATE = True
# Queues: `celery` for the short periodic work (metering, roll-ups, expiries), `notifications`
# for one outbox message per task, `reports` for what-if replays and finance exports. Each
# long task has Celery time limits; a worker started without -Q consumes all three, and one
# started with -Q (a dedicated pool) only those it names: a slow receiver or a long replay
# then never waits in front of metering. A worker takes one message ahead per process, so a
# long replay does not keep others' messages waiting behind it.
GANTRY_CELERY_QUEUES = ("celery", "notifications", "reports")
CELERY_TASK_DEFAULT_QUEUE = "celery"
CELERY_TASK_QUEUES = [
    Queue(name, Exchange(name), routing_key=name) for name in GANTRY_CELERY_QUEUES
]
CELERY_TASK_ROUTES = {
    "tenants.tasks.notification_send": {"queue": "notifications"},
    "whatif.tasks.whatif_run": {"queue": "reports"},
    "billing.tasks.cost_export_run": {"queue": "reports"},
}
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_TIMEZONE = "UTC"
# Periodic tasks (celery beat). Every task here must be idempotent: two beats may run
# (docs/faults.md 10).
CELERY_BEAT_SCHEDULE = {
    "approvals-expire": {"task": "tenants.tasks.approvals_expire", "schedule": 300.0},
    # Closes the previous month for every organisation once it is metered and the grace over.
    "billing-close-month": {"task": "billing.tasks.close_previous_month", "schedule": 3600.0},
    # Allocations against usage records: an error and a gauge on /metrics for any gap.
    "billing-usage-reconcile": {"task": "billing.tasks.usage_reconcile", "schedule": 3600.0},
    # Gives back the budget reservations of jobs already final and sends lost budget alerts.
    "billing-budget-sweep": {"task": "billing.tasks.budget_sweep", "schedule": 600.0},
}
# Approval requests not decided within this many hours expire (their jobs are rejected).
GANTRY_APPROVAL_TTL_HOURS = float(os.environ.get("GANTRY_APPROVAL_TTL_HOURS", "72"))

EMAIL_BACKEND = os.environ.get(
    "DJANGO_EMAIL_BACKEND", "django.core.mail.backends.console.EmailBackend"
)
DEFAULT_FROM_EMAIL = os.environ.get("GANTRY_FROM_EMAIL", "gantry@localhost")
# The portal's address as its users reach it, for the links in emails (no request to read it
# from when a worker sends them).
GANTRY_BASE_URL = os.environ.get("GANTRY_BASE_URL", "http://127.0.0.1:8000")

# Cluster backend for the scheduler daemon: "simulated" (embedded default) or "kubernetes".
GANTRY_CLUSTER_BACKEND = os.environ.get("GANTRY_CLUSTER_BACKEND", "simulated")
# Several clusters (docs/multicluster.md): the name of the home cluster (the backend above,
# whose nodes keep their plain names); where mounted Secrets with other clusters' kubeconfigs
# are; how long a cluster may not answer before it is lost (a cluster's own value overrides).
GANTRY_CLUSTER_NAME = os.environ.get("GANTRY_CLUSTER_NAME", "local")
GANTRY_CLUSTER_SECRETS_DIR = os.environ.get("GANTRY_CLUSTER_SECRETS_DIR", "/etc/gantry/clusters")
GANTRY_CLUSTER_LOST_AFTER_S = float(os.environ.get("GANTRY_CLUSTER_LOST_AFTER_S", "600"))
# Node agents on Kubernetes report with their pod's projected service-account token, verified
# by a TokenReview (scheduler/nodes/agent_auth.py): on by default with the Kubernetes backend.
GANTRY_AGENT_TOKEN_REVIEW = env_bool(
    "GANTRY_AGENT_TOKEN_REVIEW", GANTRY_CLUSTER_BACKEND == "kubernetes"
)
GANTRY_AGENT_TOKEN_AUDIENCE = os.environ.get("GANTRY_AGENT_TOKEN_AUDIENCE", "gantry-agent")
GANTRY_AGENT_SERVICE_ACCOUNT = os.environ.get(
    "GANTRY_AGENT_SERVICE_ACCOUNT", "system:serviceaccount:gantry-system:gantry-node-agent"
)
GANTRY_AGENT_TOKEN_CACHE_S = float(os.environ.get("GANTRY_AGENT_TOKEN_CACHE_S", "60"))
# Seed the demo organisation at container start (`seed_demo --if-enabled`); `make run` always does.
GANTRY_SEED_DEMO = env_bool("GANTRY_SEED_DEMO")
GANTRY_SCHEDULER_INTERVAL_S = float(os.environ.get("GANTRY_SCHEDULER_INTERVAL_S", "2"))
# The scheduling profile's YAML file (`run_scheduler --profile`); empty: the built-in defaults.
# The daemon reloads it when it changes; a bad new content is refused and logged.
GANTRY_SCHEDULER_PROFILE = os.environ.get("GANTRY_SCHEDULER_PROFILE", "")
# The simulated cluster's state (its pods, failed nodes), shared by the scheduler processes on
# this host and kept across their restarts; empty: in the daemon's memory only.
GANTRY_SIM_STATE_FILE = os.environ.get(
    "GANTRY_SIM_STATE_FILE", str(VAR_DIR / "simulated-cluster.state")
)
# /healthz calls the scheduler "stale" when no cycle completed for this long (seconds).
GANTRY_SCHEDULER_STALE_AFTER_S = float(os.environ.get("GANTRY_SCHEDULER_STALE_AFTER_S", "60"))
# Refuse at submit a job that no node of the cluster could hold even empty. Turn it off where
# the inventory grows (an autoscaler adds nodes): such jobs then queue, and their wait reason
# says that nothing in the cluster can hold them today. Quotas refuse either way.
GANTRY_REFUSE_BEYOND_INVENTORY = env_bool("GANTRY_REFUSE_BEYOND_INVENTORY", default=True)

# A person's API token is refused (401) this many days after it was issued; `gantry login`
# or POST /api/v1/auth/token/ then issues a new one, POST /api/v1/auth/token/rotate/ before.
GANTRY_TOKEN_LIFETIME_DAYS = float(os.environ.get("GANTRY_TOKEN_LIFETIME_DAYS", "30"))
if not GANTRY_TOKEN_LIFETIME_DAYS > 0:
    raise RuntimeError(
        f"GANTRY_TOKEN_LIFETIME_DAYS: {GANTRY_TOKEN_LIFETIME_DAYS} is not a positive number of days"
    )
# Bearer token a Prometheus scraper sends to /metrics (platform admins may read it too).
GANTRY_METRICS_TOKEN = os.environ.get("GANTRY_METRICS_TOKEN", "")
# The reverse proxies in front of the web server (the ingress controller's addresses only, never
# a pod or node network that other workloads share), as addresses or networks. Only a request
# whose direct peer is one of them has its X-Forwarded-For read, for the client address that the
# login guard and the anonymous throttles count by (common/login_guard.py); any peer listed may
# claim any client address. Guessing one account is bounded whatever the address.
GANTRY_TRUSTED_PROXIES = env_list("GANTRY_TRUSTED_PROXIES")
for _proxy in GANTRY_TRUSTED_PROXIES:
    try:
        ipaddress.ip_network(_proxy, strict=False)
    except ValueError:
        raise RuntimeError(
            f"GANTRY_TRUSTED_PROXIES: {_proxy!r} is not an IP address or network such as "
            "10.0.0.0/8 (it lists the proxies in front of Gantry, not their number)"
        ) from None

# Every HTML answer's Content-Security-Policy (common/middleware.py): the portal's scripts and
# styles are its own static files; styles may also be inline (style attributes; the <style>
# elements of htmx, plotly.js and Swagger UI); images may be data: URIs (Swagger UI's icons).
GANTRY_CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; font-src 'self' data:; connect-src 'self'; object-src 'none'; "
    "base-uri 'self'; form-action 'self'; frame-ancestors 'none'"
)
SESSION_COOKIE_HTTPONLY = True
CSRF_COOKIE_HTTPONLY = False  # the portal's HTMX requests read it to send X-CSRFToken
X_FRAME_OPTIONS = "DENY"
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
if PRODUCTION:
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_SSL_REDIRECT = env_bool("GANTRY_SSL_REDIRECT", default=True)
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_HSTS_SECONDS = int(os.environ.get("GANTRY_HSTS_SECONDS", "31536000"))
    SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    SECURE_HSTS_PRELOAD = True
    # Probes, Prometheus and the node agents reach these over plain HTTP inside the cluster
    # (the Ingress keeps /metrics off the public side; platform/k8s/30-node-agent.yaml posts to
    # the in-cluster service): a redirect to https would send them where nothing listens, and
    # urllib does not follow a redirect of a POST, so no agent report would arrive.
    SECURE_REDIRECT_EXEMPT = [r"^healthz\Z", r"^metrics\Z", r"^api/v1/nodes/report/\Z"]

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    # A refused request (PermissionDenied) is a warning line, not a traceback; a 5xx keeps its.
    "filters": {"refusals": {"()": "common.log_filters.RefusalWithoutTraceback"}},
    # The console writes to sys.stderr as it is at each record (common.log_filters).
    "handlers": {
        "console": {"class": "common.log_filters.CurrentStderrHandler", "formatter": "plain"}
    },
    "loggers": {"django.request": {"filters": ["refusals"]}},
    "root": {"handlers": ["console"], "level": os.environ.get("GANTRY_LOG_LEVEL", "INFO")},
}

# The scheduler daemon (docs/daemon.md). A job whose pods could not be created or bound this
# many times fails with the last error, instead of being placed (and preempting others) again.
GANTRY_BIND_ATTEMPTS = int(os.environ.get("GANTRY_BIND_ATTEMPTS", "5"))
# A pod bound this long ago that has not started (an image that never pulls, a missing secret)
# fails its job's attempt with the cause the cluster reports, so that its devices go back.
GANTRY_BINDING_TIMEOUT_S = float(os.environ.get("GANTRY_BINDING_TIMEOUT_S", "600"))
# A create or bind sent to the cluster that has not answered in this many seconds is given up:
# its job goes back to the queue and the cycle goes on (the call ends on its request timeout).
GANTRY_CALL_DEADLINE_S = float(os.environ.get("GANTRY_CALL_DEADLINE_S", "15"))
# A stopping pod on a node NotReady or gone this long counts as gone, as Kubernetes' pod
# garbage collector treats the pods of lost nodes: it is force-deleted and its devices released.
GANTRY_NODE_LOST_GRACE_S = float(os.environ.get("GANTRY_NODE_LOST_GRACE_S", "300"))
# The scheduler daemon's own PostgreSQL sessions (scheduler/leader.py): a leader frozen
# inside a write transaction (SIGSTOP, a hung host) is cut off by the server after the first, so it
# cannot hold the lease row's lock, and with it every standby, for as long as it is frozen.
GANTRY_DAEMON_IDLE_IN_TRANSACTION_TIMEOUT_MS = int(
    os.environ.get("GANTRY_DAEMON_IDLE_IN_TRANSACTION_TIMEOUT_MS", "5000")
)
GANTRY_DAEMON_STATEMENT_TIMEOUT_MS = int(
    os.environ.get("GANTRY_DAEMON_STATEMENT_TIMEOUT_MS", "15000")
)
GANTRY_DAEMON_LOCK_TIMEOUT_MS = int(os.environ.get("GANTRY_DAEMON_LOCK_TIMEOUT_MS", "2000"))
# Queue positions and start estimates (scheduler/estimates/refresh.py, docs/queue-estimates.md):
# the leading daemon refreshes them after a cycle at most this often, replaying at most this many
# queued jobs within this much wall time; a job without a max runtime runs this long in the replay.
GANTRY_ETA_EVERY_S = float(os.environ.get("GANTRY_ETA_EVERY_S", "30"))
GANTRY_ETA_BUDGET_S = float(os.environ.get("GANTRY_ETA_BUDGET_S", "2"))
GANTRY_ETA_MAX_JOBS = int(os.environ.get("GANTRY_ETA_MAX_JOBS", "2000"))
GANTRY_ETA_UNBOUNDED_RUNTIME_S = float(os.environ.get("GANTRY_ETA_UNBOUNDED_RUNTIME_S", "14400"))
# Expected arrivals in the replay (scheduler/estimates/arrivals.py): jobs like those created in
# the last this many seconds (0: none, the default: docs/queue-estimates.md, "Accuracy"), at most
# this many of them.
GANTRY_ETA_ARRIVALS_WINDOW_S = float(os.environ.get("GANTRY_ETA_ARRIVALS_WINDOW_S", "0"))
GANTRY_ETA_ARRIVALS_MAX = int(os.environ.get("GANTRY_ETA_ARRIVALS_MAX", "200"))
# What-if replays (docs/what-if.md): at most this many jobs of the window are replayed (the
# result says when it was capped); a job that never started runs for its max runtime, else
# this long; a finished run is kept this many days.
GANTRY_WHATIF_MAX_JOBS = int(os.environ.get("GANTRY_WHATIF_MAX_JOBS", "5000"))
GANTRY_WHATIF_DEFAULT_RUNTIME_S = float(os.environ.get("GANTRY_WHATIF_DEFAULT_RUNTIME_S", "3600"))
GANTRY_WHATIF_RETENTION_DAYS = float(os.environ.get("GANTRY_WHATIF_RETENTION_DAYS", "90"))
# Each person has one run queued or running at a time, and each scope (a tenant, or the whole
# platform) this many runs a sliding day; a replay stops (failed) after this many seconds.
GANTRY_WHATIF_RUNS_PER_DAY = int(os.environ.get("GANTRY_WHATIF_RUNS_PER_DAY", "20"))
GANTRY_WHATIF_TIME_LIMIT_S = float(os.environ.get("GANTRY_WHATIF_TIME_LIMIT_S", "600"))
if GANTRY_WHATIF_RUNS_PER_DAY < 1 or not GANTRY_WHATIF_TIME_LIMIT_S > 0:
    raise RuntimeError(
        "GANTRY_WHATIF_RUNS_PER_DAY must be 1 or more and GANTRY_WHATIF_TIME_LIMIT_S positive"
    )
if GANTRY_WHATIF_MAX_JOBS < 1 or not GANTRY_WHATIF_RETENTION_DAYS > 0:
    raise RuntimeError(
        "GANTRY_WHATIF_MAX_JOBS must be 1 or more and GANTRY_WHATIF_RETENTION_DAYS positive"
    )
CELERY_BEAT_SCHEDULE["whatifs-expire"] = {"task": "whatif.tasks.whatifs_expire", "schedule": 3600.0}

# Capacity planning (capacity/, docs/capacity.md): the forecasts are refreshed by beat, never
# at a page view, from this many days of history, this many days ahead; a pool without a
# target of its own is full at this utilization.
GANTRY_CAPACITY_HISTORY_DAYS = int(os.environ.get("GANTRY_CAPACITY_HISTORY_DAYS", "180"))
GANTRY_CAPACITY_HORIZON_DAYS = int(os.environ.get("GANTRY_CAPACITY_HORIZON_DAYS", "180"))
GANTRY_CAPACITY_TARGET_UTILIZATION = float(
    os.environ.get("GANTRY_CAPACITY_TARGET_UTILIZATION", "0.8")
)
GANTRY_CAPACITY_REFRESH_S = float(os.environ.get("GANTRY_CAPACITY_REFRESH_S", "21600"))
if not (
    14 <= GANTRY_CAPACITY_HISTORY_DAYS <= 1000
    and 1 <= GANTRY_CAPACITY_HORIZON_DAYS <= 366
    and 0 < GANTRY_CAPACITY_TARGET_UTILIZATION <= 1
    and GANTRY_CAPACITY_REFRESH_S > 0
):
    raise RuntimeError(
        "GANTRY_CAPACITY_HISTORY_DAYS must be 14..1000, GANTRY_CAPACITY_HORIZON_DAYS 1..366, "
        "GANTRY_CAPACITY_TARGET_UTILIZATION in (0, 1] and GANTRY_CAPACITY_REFRESH_S positive"
    )
CELERY_TASK_ROUTES["capacity.tasks.capacity_refresh"] = {"queue": "reports"}
CELERY_BEAT_SCHEDULE["capacity-refresh"] = {
    "task": "capacity.tasks.capacity_refresh",
    "schedule": GANTRY_CAPACITY_REFRESH_S,
}

# Billing (docs/billing.md). Every price is in this one ISO 4217 currency.
try:
    from billing.currency import validate_currency

    GANTRY_BILLING_CURRENCY = validate_currency(os.environ.get("GANTRY_BILLING_CURRENCY", "EUR"))
except ValueError as _error:
    raise RuntimeError(f"GANTRY_BILLING_CURRENCY: {_error}") from None
# Metering meters an hour this long after it ended, so that the daemon's last writes about it
# (an allocation ended a few seconds late) are in before its usage is fixed for good.
GANTRY_METERING_DELAY_S = float(os.environ.get("GANTRY_METERING_DELAY_S", "300"))
# Each run meters every closed hour not metered yet, so a late or missed run catches up. It
# runs hourly at the minute each hour becomes due (minute 5 for 300 s), so the portal can say
# when costs appear (billing/metering/schedule.py).
from billing.metering.schedule import metering_beat_schedule  # noqa: E402

CELERY_BEAT_SCHEDULE["billing-meter"] = {
    "task": "billing.tasks.meter_closed_hours",
    "schedule": metering_beat_schedule(GANTRY_METERING_DELAY_S),
}
# The month is closed automatically this many hours after it ended (and once it is metered
# completely): time for finance to look before the statements are frozen.
GANTRY_BILLING_CLOSE_AFTER_H = float(os.environ.get("GANTRY_BILLING_CLOSE_AFTER_H", "24"))
# Finance exports (docs/billing.md "Exports"): files written by the worker, kept this many hours
# for their owner to download, then deleted by the beat task below.
GANTRY_EXPORT_DIR = Path(os.environ.get("GANTRY_EXPORT_DIR", VAR_DIR / "exports"))
GANTRY_EXPORT_RETENTION_H = float(os.environ.get("GANTRY_EXPORT_RETENTION_H", "24"))
if not GANTRY_EXPORT_RETENTION_H > 0:
    raise RuntimeError(
        f"GANTRY_EXPORT_RETENTION_H: {GANTRY_EXPORT_RETENTION_H} is not a positive number of hours"
    )
# Each person has one export queued or running at a time and this many a sliding day; an
# export stops (failed) after this many seconds.
GANTRY_EXPORT_RUNS_PER_DAY = int(os.environ.get("GANTRY_EXPORT_RUNS_PER_DAY", "50"))
GANTRY_EXPORT_TIME_LIMIT_S = float(os.environ.get("GANTRY_EXPORT_TIME_LIMIT_S", "900"))
if GANTRY_EXPORT_RUNS_PER_DAY < 1 or not GANTRY_EXPORT_TIME_LIMIT_S > 0:
    raise RuntimeError(
        "GANTRY_EXPORT_RUNS_PER_DAY must be 1 or more and GANTRY_EXPORT_TIME_LIMIT_S positive"
    )
CELERY_BEAT_SCHEDULE["billing-exports-expire"] = {
    "task": "billing.tasks.cost_exports_expire",
    "schedule": 900.0,
}

# Utilization history and idle GPUs (docs/utilization.md). Samples per device every
# GANTRY_UTILIZATION_SAMPLE_S (the daemon's simulated readings; agents report on their own
# interval, and a device's readings closer together than half of it are absorbed). Raw
# samples are kept this many hours, 5-minute and hourly roll-ups this many days.
GANTRY_UTILIZATION_SAMPLE_S = float(os.environ.get("GANTRY_UTILIZATION_SAMPLE_S", "30"))
GANTRY_UTILIZATION_RAW_HOURS = float(os.environ.get("GANTRY_UTILIZATION_RAW_HOURS", "48"))
GANTRY_UTILIZATION_5M_DAYS = float(os.environ.get("GANTRY_UTILIZATION_5M_DAYS", "30"))
GANTRY_UTILIZATION_1H_DAYS = float(os.environ.get("GANTRY_UTILIZATION_1H_DAYS", "400"))
# Each GPU's XID history (the nodes page) is kept this many days by the same beat task.
GANTRY_XID_RETENTION_DAYS = float(os.environ.get("GANTRY_XID_RETENTION_DAYS", "90"))
if not GANTRY_XID_RETENTION_DAYS > 0:
    raise RuntimeError(
        f"GANTRY_XID_RETENTION_DAYS: {GANTRY_XID_RETENTION_DAYS} is not a positive number of days"
    )
# An agent's XIDs as history rows (scheduler/nodes/xids.py): a repeat of a (GPU, code) within
# GANTRY_XID_COALESCE_S of its row adds to that row's count; at most GANTRY_XID_ROWS_PER_MINUTE
# new rows per node in any minute (fatal codes first), so an XID storm cannot flood the table.
GANTRY_XID_COALESCE_S = float(os.environ.get("GANTRY_XID_COALESCE_S", "60"))
GANTRY_XID_ROWS_PER_MINUTE = int(os.environ.get("GANTRY_XID_ROWS_PER_MINUTE", "64"))
# The idle rule where no tenant up the tree sets one (tenants.IdleRule): a job whose devices
# all stay under the threshold (%) for the duration (s) is idle; the action is notify,
# notify_and_stop (also stop interactive jobs) or nothing.
GANTRY_IDLE_THRESHOLD_PCT = float(os.environ.get("GANTRY_IDLE_THRESHOLD_PCT", "5"))
GANTRY_IDLE_DURATION_S = float(os.environ.get("GANTRY_IDLE_DURATION_S", "1800"))
GANTRY_IDLE_ACTION = os.environ.get("GANTRY_IDLE_ACTION", "notify")
if GANTRY_IDLE_ACTION not in ("notify", "notify_and_stop", "nothing"):
    raise RuntimeError(
        f"GANTRY_IDLE_ACTION: {GANTRY_IDLE_ACTION!r} is not one of notify, notify_and_stop, nothing"
    )
CELERY_BEAT_SCHEDULE.update(
    {
        # Each run rolls up every closed window not rolled up yet, then scans for idle jobs
        # and deletes what retention no longer keeps: a missed run catches up.
        "utilization-rollup": {"task": "scheduler.tasks.utilization_rollup", "schedule": 60.0},
    }
)

# Notifications (docs/notifications.md): the outbox's webhooks and emails. A failed delivery
# is retried after GANTRY_NOTIFY_BACKOFF_S, doubling up to GANTRY_NOTIFY_BACKOFF_MAX_S, at most
# GANTRY_NOTIFY_MAX_ATTEMPTS times; at most GANTRY_NOTIFY_MAX_PENDING wait per tenant and
# channel (older ones are dropped). The job's owner is emailed for the job events named in
# GANTRY_NOTIFY_EMAIL_EVENTS (comma-separated: started, finished, failed, preempted, requeued).
# One webhook delivery's whole time, lookup, connection, post and answer together
# (tenants/webhooks.py), not a timeout per socket read.
GANTRY_NOTIFY_TIMEOUT_S = float(os.environ.get("GANTRY_NOTIFY_TIMEOUT_S", "10"))
# Webhooks post only to public addresses; on: also to private, loopback and link-local ones
# (receivers on an on-premises network, the tests' local servers). Never in a shared cluster.
GANTRY_WEBHOOK_ALLOW_PRIVATE = env_bool("GANTRY_WEBHOOK_ALLOW_PRIVATE")
GANTRY_NOTIFY_BACKOFF_S = float(os.environ.get("GANTRY_NOTIFY_BACKOFF_S", "30"))
GANTRY_NOTIFY_BACKOFF_MAX_S = float(os.environ.get("GANTRY_NOTIFY_BACKOFF_MAX_S", "3600"))
GANTRY_NOTIFY_MAX_ATTEMPTS = int(os.environ.get("GANTRY_NOTIFY_MAX_ATTEMPTS", "8"))
GANTRY_NOTIFY_MAX_PENDING = int(os.environ.get("GANTRY_NOTIFY_MAX_PENDING", "200"))
# Sent, failed and dropped notifications are deleted this many days after they were written.
GANTRY_NOTIFY_RETENTION_DAYS = float(os.environ.get("GANTRY_NOTIFY_RETENTION_DAYS", "30"))
# A job's preempted notification waits this long for more preemptions of the job to join it
# (one message with a count, scheduler/jobs/notifications.py).
GANTRY_NOTIFY_COALESCE_S = float(os.environ.get("GANTRY_NOTIFY_COALESCE_S", "60"))
GANTRY_NOTIFY_EMAIL_EVENTS = frozenset(
    part.strip()
    for part in os.environ.get(
        "GANTRY_NOTIFY_EMAIL_EVENTS", "finished,failed,preempted,requeued"
    ).split(",")
    if part.strip()
)
if not {"started", "finished", "failed", "preempted", "requeued"} >= GANTRY_NOTIFY_EMAIL_EVENTS:
    raise RuntimeError(
        "GANTRY_NOTIFY_EMAIL_EVENTS: only started, finished, failed, preempted and requeued, "
        f"not {sorted(GANTRY_NOTIFY_EMAIL_EVENTS)}"
    )
if GANTRY_NOTIFY_MAX_ATTEMPTS < 1 or GANTRY_NOTIFY_MAX_PENDING < 1:
    raise RuntimeError("GANTRY_NOTIFY_MAX_ATTEMPTS and GANTRY_NOTIFY_MAX_PENDING must be 1 or more")
# Sends what is due (the outbox's retries, and rows written by the daemon, which kicks none).
CELERY_BEAT_SCHEDULE["notifications-deliver"] = {
    "task": "tenants.tasks.notifications_deliver",
    "schedule": 30.0,
}
