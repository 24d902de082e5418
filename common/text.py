"""Validators for text that reaches Kubernetes labels, logs and spreadsheet exports."""

import re
import unicodedata

from django.core.exceptions import ValidationError

# Validating regexes end in \Z, never $: $ also matches before a trailing newline.
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?\Z")
FORMULA_PREFIXES = ("=", "+", "-", "@", "\t", "\r")
# Namespaces jobs never run in: no Pod Security enforcement, and Gantry's own or the cluster's
# pods live there (and every `kube-*` one).
SYSTEM_NAMESPACES = frozenset(
    {"default", "kube-system", "kube-public", "kube-node-lease", "gantry-system"}
)


def validate_dns_label(value: str) -> None:
    """A Kubernetes-safe name: lowercase letters, digits and '-', 1-63 chars."""
    if not DNS_LABEL.match(value or ""):
        raise ValidationError(
            f"{value[:70]!r} is not a valid name: use 1-63 lowercase letters, digits or '-', "
            "starting and ending with a letter or digit."
        )


def is_system_namespace(name: str) -> bool:
    return name in SYSTEM_NAMESPACES or name.startswith("kube-")


def validate_display_text(value: str) -> None:
    """Free text shown to people: no control or format characters, no formula prefix."""
    for ch in value:
        if unicodedata.category(ch) in {"Cc", "Cf", "Cs", "Co"}:
            raise ValidationError(f"contains the control character U+{ord(ch):04X}.")
    if value.startswith(FORMULA_PREFIXES):
        raise ValidationError(f"must not start with {value[0]!r} (spreadsheet formula prefix).")


def csv_safe(value: object) -> str:
    """Neutralise spreadsheet formula injection in an exported cell (OWASP advice)."""
    text = "" if value is None else str(value)
    if text.startswith(FORMULA_PREFIXES):
        return "'" + text
    return text
