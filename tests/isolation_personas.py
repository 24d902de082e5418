"""The personas the isolation walks add to the shared organisation (tests/conftest.py).

    april    approver of team-alpha (approves, administers nothing)
    gus      member of team-charlie-ml, a group below team-charlie, with its own project
    nobody   logged in, no role anywhere
    node-agent:n-walk  the account of node n-walk's agent (`manage.py node_agent_token`):
             it reports for its node and may call nothing else

Tokens: `token_client` authenticates as a real client does (`Authorization: Token ...`), not
through `force_authenticate`, so the walks also cover the token path.
"""

from __future__ import annotations

from typing import Any

from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from scheduler.models import NodeAgent
from tenants.models import Project, Role, TenantKind
from tests import factories as f
from tests.conftest import Org

AGENT = "node-agent:n-walk"
AGENT_NODE = "n-walk"


def add_personas(org: Org) -> Project:
    """Add the personas above to `org.users`; returns gus's group project."""
    users = {name: f.UserFactory(username=name) for name in ["april", "gus", "nobody"]}
    f.MembershipFactory(user=users["april"], tenant=org.alpha, role=Role.APPROVER)
    group = f.TenantFactory(slug="team-charlie-ml", kind=TenantKind.GROUP, parent=org.charlie)
    f.MembershipFactory(user=users["gus"], tenant=group, role=Role.MEMBER)
    agent = f.UserFactory(username=AGENT)
    agent.set_unusable_password()
    agent.save()
    NodeAgent.objects.create(user=agent, node_name=AGENT_NODE)
    org.users.update(users)
    org.users[AGENT] = agent
    return f.ProjectFactory(tenant=group, slug="proj-charlie-ml")


def token_key(user: Any) -> str:
    token, _ = Token.objects.get_or_create(user=user)
    return str(token.key)


def token_client(user: Any) -> APIClient:
    """An API client that sends the user's DRF token, as the CLI and the node agent do."""
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token_key(user)}")
    return client
