"""Validators for text that reaches Kubernetes labels, logs and spreadsheet exports."""

import re
import unicodedata

from django.core.exceptions import ValidationError

# Validating regexes end in \Z, never $: $ also matches before a trailing newline.
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?\Z")
# Kubernetes label syntax: a value is 0-63 letters, digits, '-', '_' or '.', starting and ending
# alphanumeric; a key is such a name (1-63), optionally after a DNS subdomain prefix and '/'.
LABEL_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
LABEL_VALUE = re.compile(rf"^({LABEL_NAME})?\Z")
LABEL_KEY = re.compile(
    rf"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?{LABEL_NAME}\Z"
)
MAX_LABELS = 32
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


def label_errors(labels: object, *, limit: int = MAX_LABELS) -> list[str]:
    """What is wrong with `labels` as Kubernetes-style labels (an object of strings), each a
    sentence; [] when nothing is."""
    if not isinstance(labels, dict):
        return ["An object of label keys to values."]
    if len(labels) > limit:
        return [f"At most {limit} labels; {len(labels)} given."]
    errors = []
    for key, value in labels.items():
        shown = str(key)[:70]
        if not isinstance(key, str) or not LABEL_KEY.match(key) or len(key) > 253 + 1 + 63:
            errors.append(
                f"{shown!r} is not a label key: 1-63 letters, digits, '-', '_' or '.' "
                "(alphanumeric at both ends), optionally after a DNS prefix and '/'."
            )
        elif not isinstance(value, str) or not LABEL_VALUE.match(value):
            errors.append(
                f"{shown}: {str(value)[:70]!r} is not a label value: up to 63 letters, digits, "
                "'-', '_' or '.', alphanumeric at both ends."
            )
    return errors


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
