"""The repository's shape, as the foundation issue and ARCHITECTURE.md describe it."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

REQUIRED = [
    "manage.py",
    "pyproject.toml",
    "config",
    "platform",
    "common",
    "tenants",
    "scheduler",
    "billing",
    "templates",
    "docker-compose.yml",
    "tests/__init__.py",
    "README.md",
    "Makefile",
    ".ci/run",
    "scheduler/core",
    "scheduler/backends",
    "bench",
]


def test_top_level_layout_exists() -> None:
    missing = [path for path in REQUIRED if not (ROOT / path).exists()]
    assert not missing, missing


def test_readme_opens_with_the_two_commands() -> None:
    readme = (ROOT / "README.md").read_text()
    first_block = re.search(r"```(?:sh|bash|console)?\n(.*?)```", readme, re.S)
    assert first_block is not None, "README needs a code block with the two commands"
    commands = [
        line.split("#")[0].strip()
        for line in first_block.group(1).splitlines()
        if line.strip() and not line.strip().startswith("#")
    ]
    assert commands[:2] == ["make run", "make test"], commands
    assert readme.index("make run") < 800, "the two commands must open the README"


def test_ci_runs_the_readme_test_command() -> None:
    script = (ROOT / ".ci/run").read_text()
    assert re.search(r"^make test\b", script, re.M), script


def test_every_environment_variable_read_is_documented() -> None:
    readme = (ROOT / "README.md").read_text()
    names: set[str] = set()
    for path in ROOT.glob("config/*.py"):
        names |= set(
            re.findall(
                r"""(?:environ\.get|env_bool|env_list)\(\s*["']([A-Z_]+)["']""", path.read_text()
            )
        )
    assert names, "no environment variables found; the pattern is stale"
    undocumented = sorted(name for name in names if f"`{name}`" not in readme)
    assert not undocumented, undocumented


# The project speaks of itself: a figure carries its date and command, never the work
# session that measured it (bench/results.md keeps the dated figures).
SOURCE_DIRS = [
    "bench",
    "billing",
    "cli",
    "common",
    "config",
    "devcluster",
    "docs",
    "platform",
    "portal",
    "scheduler",
    "templates",
    "tenants",
    "tests",
    "whatif",
]
SOURCE_SUFFIXES = {".py", ".md", ".html", ".toml", ".txt"}


def _source_files() -> list[Path]:
    files = [ROOT / "README.md", ROOT / "Makefile", ROOT / "pyproject.toml"]
    for name in SOURCE_DIRS:
        files += [
            path
            for path in (ROOT / name).rglob("*")
            if path.suffix in SOURCE_SUFFIXES and "__pycache__" not in path.parts
        ]
    return [path for path in files if path.is_file()]


def test_no_work_session_numbers_in_docs_or_code() -> None:
    pattern = re.compile(r"\bsession ?\d", re.I)
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in _source_files()
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
        if pattern.search(line)
    ]
    assert not found, found


FAULTS_DOC = ROOT / "docs" / "faults.md"
# "docs/faults.md 24", "docs/faults.md 1-7, 20 and 21": the numbers after the file name.
FAULT_REFERENCE = re.compile(r"docs/faults\.md((?:(?:,| and)? \d+(?:-\d+)?\b)+)")


def _fault_numbers(text: str) -> set[int]:
    numbers: set[int] = set()
    for first, last in re.findall(r"(\d+)(?:-(\d+))?", text):
        numbers |= set(range(int(first), int(last or first) + 1))
    return numbers


def test_fault_catalogue_references_name_items_of_docs_faults_md() -> None:
    assert FAULTS_DOC.is_file(), "the fault catalogue belongs in the repository"
    items = {int(number) for number in re.findall(r"^(\d+)\. ", FAULTS_DOC.read_text(), re.M)}
    assert items, "docs/faults.md lists no numbered items"
    stale = re.compile("FAULT" + r"S(?:\.md)? ?\d")  # the catalogue outside the repository
    missing: list[str] = []
    outside: list[str] = []
    cited = 0
    for path in _source_files():
        text = path.read_text(errors="replace")
        for match in FAULT_REFERENCE.finditer(text):
            numbers = _fault_numbers(match.group(1))
            cited += len(numbers) if path != FAULTS_DOC else 0
            if numbers - items:
                missing.append(f"{path.relative_to(ROOT)}: {match.group(0)}")
        if path != FAULTS_DOC and stale.search(text):
            outside.append(str(path.relative_to(ROOT)))
    assert cited, "no reference to docs/faults.md found; the pattern is stale"
    assert not missing, missing
    assert not outside, outside


PRODUCT = ["config", "common", "tenants", "scheduler", "billing", "whatif", "portal", "cli"]


def _module_level_imports() -> dict[str, set[str]]:
    """Each product module's imports at module level (not in functions, not for type checking
    only), as the product's modules they load."""
    modules: dict[str, Path] = {}
    for root in PRODUCT:
        for path in (ROOT / root).rglob("*.py"):
            if "migrations" in path.parts:
                continue
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            modules[name.removesuffix(".__init__")] = path

    def resolve(target: str) -> str:
        while target and target not in modules:
            target = target.rpartition(".")[0]
        return target

    def top(body: list[ast.stmt]) -> Iterator[ast.Import | ast.ImportFrom]:
        for node in body:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                continue
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                yield node
            elif isinstance(node, (ast.If, ast.Try)):
                handlers = [s for h in getattr(node, "handlers", []) for s in h.body]
                yield from top(node.body + node.orelse + handlers)

    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for node in top(ast.parse(path.read_text()).body):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif node.level == 0 and node.module:
                # `from package import module` loads the module (the package is being
                # imported already); `from module import name` loads the module.
                targets = [
                    f"{node.module}.{alias.name}"
                    if f"{node.module}.{alias.name}" in modules
                    else node.module
                    for alias in node.names
                ]
            else:
                continue
            graph[name] |= {t for t in map(resolve, targets) if t and t != name}
    return graph


def test_no_import_cycle_at_module_level_anywhere_in_the_product() -> None:
    """Issue 36: modules load each other without a cycle; the few function-level imports that
    remain (a service enqueuing its own Celery task) are listed in pyproject.toml's import
    contracts with why."""
    graph = _module_level_imports()
    done: set[str] = set()
    cycles: list[list[str]] = []

    def visit(name: str, path: list[str], on_path: set[str]) -> None:
        for target in sorted(graph[name]):
            if target in on_path:
                cycles.append([*path[path.index(target) :], target])
            elif target not in done:
                visit(target, [*path, target], on_path | {target})
        done.add(name)

    for name in sorted(graph):
        if name not in done:
            visit(name, [name], {name})
    assert not cycles, "\n".join(" -> ".join(c) for c in cycles)
