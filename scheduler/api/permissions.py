"""The API's default permission (settings.REST_FRAMEWORK): an authenticated person.

A node agent's account (`manage.py node_agent_token`) holds no role, so without this it would
read every list as an empty one and reach every route a person reaches; a token leaked from a
GPU node must speak for that node's GPU report and nothing else. The report action lets agents
in (`scheduler.api.nodes`, `permission_classes` of the action) and checks the node itself.
"""

from __future__ import annotations

from typing import Any

from rest_framework.authentication import TokenAuthentication
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request

from scheduler.models import NodeAgent


class PeopleOnly(IsAuthenticated):
    message = "Node agent accounts may only post GPU reports (POST /api/v1/nodes/report/)."

    def has_permission(self, request: Request, view: Any) -> bool:
        if not super().has_permission(request, view):
            return False
        # Agents have no usable password, so they come with a token or not at all: a
        # session's user is a person, and only token requests pay for the look-up.
        if not isinstance(request.successful_authenticator, TokenAuthentication):
            return True
        user_pk = request.user.pk
        return user_pk is None or not NodeAgent.objects.filter(user_id=user_pk).exists()
