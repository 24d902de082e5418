"""`{% gantry_version %}`: the installation's version, for the portal's footer."""

from __future__ import annotations

from django import template

from common.releases.version import gantry_version as installed_version

register = template.Library()


@register.simple_tag
def gantry_version() -> str:
    return installed_version()
