"""Which XIDs mean the GPU itself is broken, and what the common ones mean: one list for the
node agent (its own `healthy` verdict) and the server (which marks the device unhealthy).

Pure: the agent runs on GPU nodes without Django, so this module imports nothing of Gantry.

The fatal set follows NVIDIA's XID catalogue for Ampere and newer (docs.nvidia.com/deploy/
xid-errors), keeping the codes whose immediate action is a GPU reset or more: the device must
take no new work until an admin has reset or replaced it. Left out on purpose:
- 63 (a row remapped or a page retired) succeeded; it is a signal to watch, not a fault;
- 92 (high single-bit ECC rate) is corrected errors, a trend to watch;
- 94 (contained ECC error) ends only the application that touched the row (RESTART_APP);
  the device keeps serving others;
- application faults (13, 31, 43, 45) say nothing about the hardware.
"""

from __future__ import annotations

FATAL_XIDS = frozenset({48, 62, 64, 74, 79, 95, 119, 120})

XID_MEANINGS: dict[int, str] = {
    13: "graphics engine exception (usually the application)",
    31: "GPU memory page fault (usually the application)",
    43: "GPU stopped processing (usually the application)",
    45: "preemptive cleanup after an earlier error",
    48: "double-bit ECC error",
    61: "internal micro-controller breakpoint",
    62: "internal micro-controller halt",
    63: "ECC row remapped or page retired (reset to activate)",
    64: "ECC row remapping or page retirement failed",
    68: "video processor exception",
    69: "graphics engine class error",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error (the application is ended)",
    95: "uncontained ECC error",
    109: "context switch timeout",
    119: "GSP RPC timeout",
    120: "GSP error",
    154: "GPU recovery action changed",
}


def xid_fatal(code: int) -> bool:
    return code in FATAL_XIDS


def xid_meaning(code: int) -> str:
    """A short meaning for the known codes, "" for the others."""
    return XID_MEANINGS.get(code, "")
