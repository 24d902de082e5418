"""`manage.py node_agent_token NODE`: the API token of NODE's agent, bound to that node.

Creates (or finds) the agent account of the node, binds it to the node (`NodeAgent`) and prints
its token. `--rotate` replaces the token (the old one stops working at once); `--revoke`
deletes the account. The agent may report only for its node: a leaked token speaks for one
node, not for the cluster (docs/kubernetes.md, "The node agent").
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction
from rest_framework.authtoken.models import Token

from common.text import DNS_LABEL
from scheduler.models import NodeAgent
from scheduler.nodes.agent_auth import agent_username

# Kubernetes node names are DNS subdomains: labels joined by dots, 253 characters at most.
MAX_NODE_NAME = 253


def valid_node_name(node: str) -> bool:
    labels = node.split(".")
    return len(node) <= MAX_NODE_NAME and all(DNS_LABEL.match(label) for label in labels)


class Command(BaseCommand):
    help = "Print the API token of a node's agent, which may report for that node only."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("node", help="The node's name as the cluster lists it.")
        group = parser.add_mutually_exclusive_group()
        group.add_argument("--rotate", action="store_true", help="Replace the token.")
        group.add_argument("--revoke", action="store_true", help="Delete the agent account.")

    @transaction.atomic
    def handle(self, *args: Any, **options: Any) -> None:
        node = options["node"]
        if not valid_node_name(node):
            raise CommandError(f"{node[:80]!r} is not a Kubernetes node name.")
        agent = NodeAgent.objects.select_related("user").filter(node_name=node).first()
        if options["revoke"]:
            if agent is None:
                raise CommandError(f"node {node} has no agent account.")
            agent.user.delete()
            self.stdout.write(f"revoked the agent account of {node}")
            return
        if agent is None:
            user, _ = get_user_model().objects.get_or_create(username=agent_username(node))
            user.set_unusable_password()  # a token only: no portal login, no token endpoint
            user.save()
            agent = NodeAgent.objects.create(user=user, node_name=node)
        if options["rotate"]:
            Token.objects.filter(user=agent.user).delete()
        token, _ = Token.objects.get_or_create(user=agent.user)
        self.stdout.write(token.key)
