"""The API takes what its schema says and no more, and answers as it says (issue 34, items
18, 21 and 22): OPTIONS without a 500, duplicate JSON keys and non-canonical ids refused,
bounded priority values, a 204 where one is documented, the error shape everywhere, and a
schema that states what the server refuses."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from scheduler.models import Job
from tenants.models import IdleRule, PriorityClass, ResourceFlavor
from tests import factories as f
from tests.conftest import Org, job_spec
from whatif.models import WhatIf

SCHEMA: list[dict[str, Any]] = []


def schema(client: Any) -> dict[str, Any]:
    if not SCHEMA:
        SCHEMA.append(yaml.safe_load(client.get("/api/v1/schema/").content))
    return SCHEMA[0]


def post_raw(client: Any, url: str, body: str) -> Any:
    return client.generic("POST", url, data=body, content_type="application/json")


def test_options_on_a_view_without_a_queryset_answers(org: Org, client_for: Any) -> None:
    response = client_for("pat").options(f"/api/v1/billing-policies/{org.acme.pk}/")
    assert response.status_code == 200, response.content
    assert set(response["Allow"].replace(" ", "").split(",")) == {"GET", "HEAD", "PUT", "OPTIONS"}
    assert "actions" not in response.json()


def test_a_duplicate_json_key_is_400_naming_it(org: Org, client_for: Any) -> None:
    spec = json.dumps(job_spec())
    body = f'{{"project": {org.proj_alpha.pk}, "project": {org.proj_bravo.pk}, "spec": {spec}}}'
    response = post_raw(client_for("alice"), "/api/v1/jobs/", body)
    assert response.status_code == 400
    assert "'project' more than once" in response.json()["detail"]
    nested = f'{{"project": {org.proj_alpha.pk}, "spec": {spec[:-1]}, "name": "x"}}}}'
    response = post_raw(client_for("alice"), "/api/v1/jobs/", nested)
    assert "'name' more than once" in response.json()["detail"]
    assert not Job.objects.exists()


@pytest.mark.parametrize("raw", ["+{pk}", "0{pk}", "{pk}.0", " {pk}", "-{pk}", "0"])
def test_an_id_in_a_path_is_canonical_decimal(org: Org, client_for: Any, raw: str) -> None:
    client = client_for("pat")
    pk = org.alpha.pk
    assert client.get(f"/api/v1/tenants/{pk}/").status_code == 200
    response = client.get(f"/api/v1/tenants/{raw.format(pk=pk)}/")
    assert response.status_code == 404
    assert response["Content-Type"] == "application/json"


@pytest.mark.parametrize("value", [2**63, -(2**63), 10**9 + 1, -(10**9) - 1])
def test_a_priority_value_out_of_range_is_400(org: Org, client_for: Any, value: int) -> None:
    body = {"name": "huge", "value": value}
    response = client_for("pat").post("/api/v1/priority-classes/", body, format="json")
    assert response.status_code == 400
    assert "value" in response.json()["errors"]
    assert not PriorityClass.objects.filter(name="huge").exists()


def test_the_schema_bounds_priority_values(org: Org, client_for: Any) -> None:
    value = schema(client_for("pat"))["components"]["schemas"]["PriorityClassRequest"]
    bounds = value["properties"]["value"]
    assert (bounds["minimum"], bounds["maximum"]) == (-(10**9), 10**9)


def test_deleting_an_idle_rule_is_the_documented_204(org: Org, client_for: Any) -> None:
    IdleRule.objects.create(tenant=org.alpha, threshold_pct=3)
    client = client_for("pat")
    response = client.delete(f"/api/v1/tenants/{org.alpha.pk}/idle-rule/")
    assert (response.status_code, response.content) == (204, b"")
    documented = schema(client)["paths"]["/api/v1/tenants/{id}/idle-rule/"]["delete"]
    assert "204" in documented["responses"] and "200" not in documented["responses"]


def test_a_bad_page_size_answers_the_error_shape(org: Org, client_for: Any) -> None:
    response = client_for("alice").get("/api/v1/jobs/?page_size=0")
    assert response.status_code == 400
    assert response.json()["errors"]["page_size"] == ["must be an integer from 1 to 200, got '0'."]


def test_request_bodies_refuse_undeclared_fields_in_the_schema(org: Org, client_for: Any) -> None:
    components = schema(client_for("pat"))["components"]["schemas"]
    requests = {name: c for name, c in components.items() if name.endswith("Request")}
    assert requests and all(c["additionalProperties"] is False for c in requests.values())
    # A map keeps what its values are.
    labels = components["FlavorRequest"]["properties"]["node_labels"]
    assert labels == {"type": "object", "additionalProperties": {"type": "string"}}


def test_flavor_lists_and_maps_are_typed_and_not_nullable(org: Org, client_for: Any) -> None:
    client = client_for("pat")
    properties = schema(client)["components"]["schemas"]["FlavorRequest"]["properties"]
    assert properties["mig_profiles"] == {
        "type": "array",
        "items": {"type": "string", "maxLength": 32},
    }
    body = {"name": "B200-192GB", "resource_name": "nvidia.com/gpu", "mig_profiles": None}
    response = client.post("/api/v1/flavors/", body, format="json")
    assert "mig_profiles" in response.json()["errors"]
    assert not ResourceFlavor.objects.filter(name="B200-192GB").exists()


def test_empty_query_values_are_refused_as_the_schema_says(org: Org, client_for: Any) -> None:
    client = client_for("alice")
    assert "name" in client.get("/api/v1/jobs/?name=").json()["errors"]
    parameters = schema(client)["paths"]["/api/v1/jobs/"]["get"]["parameters"]
    name = next(p for p in parameters if p["name"] == "name")
    assert name["schema"]["minLength"] == 1


def test_a_what_if_s_nullable_fields_are_documented_nullable(org: Org, client_for: Any) -> None:
    out = schema(client_for("pat"))["components"]["schemas"]["WhatIfOut"]["properties"]
    assert out["approval_request"]["nullable"] is True
    assert out["scope"]["nullable"] is True
    assert not WhatIf.objects.exists()


def test_a_name_given_as_a_number_is_400(org: Org, client_for: Any) -> None:
    """Found by bench.fuzz: `"priority_class": 0` was read as the name "0"."""
    body = {"tenant": org.alpha.pk, "job_type": "batch", "priority_class": 0}
    response = client_for("pat").post("/api/v1/priority-defaults/", body, format="json")
    assert response.status_code == 400
    assert response.json()["errors"]["priority_class"] == ["must be a string, got a number."]


def test_path_ids_are_bounded_in_the_schema_as_routed(org: Org, client_for: Any) -> None:
    paths = schema(client_for("pat"))["paths"]
    for path in ("/api/v1/jobs/{id}/", "/api/v1/billing-policies/{id}/"):
        (id_,) = [p for p in paths[path]["get"]["parameters"] if p["in"] == "path"]
        assert id_["schema"] in (
            {"type": "string", "pattern": "^[1-9][0-9]{0,17}$"},  # the route's own pattern
            {"type": "integer", "minimum": 1, "maximum": 10**18 - 1},
        ), path


def test_a_membership_patch_without_a_role_keeps_it(org: Org, client_for: Any) -> None:
    """Found by bench.fuzz: the PATCH's schema makes `role` optional, the server required it."""
    membership = org.alpha.memberships.get(user=org.users["alice"])
    url = f"/api/v1/memberships/{membership.pk}/"
    response = client_for("tina").patch(url, {}, format="json")
    assert response.status_code == 200, response.content
    assert response.json()["role"] == membership.role
    assert client_for("alice").patch(url, {}, format="json").status_code == 403


def test_a_what_if_change_is_documented_per_kind(org: Org, client_for: Any) -> None:
    """Found by bench.fuzz: one flat object called `{"kind": "quota"}` valid; the server
    wants the fields of its kind and no other."""
    components = schema(client_for("pat"))["components"]["schemas"]
    quota, klass = components["WhatIfInRequest"]["properties"]["changes"]["items"]["oneOf"]
    assert quota["required"] == ["kind", "tenant", "flavor"]
    assert klass["required"] == ["kind", "name", "value"]
    body = {"changes": [{"kind": "quota", "name": "x"}]}
    response = client_for("pat").post("/api/v1/what-ifs/", body, format="json")
    assert response.status_code == 400


@pytest.mark.parametrize("path", ["/api/v1/tenants/+1/", "/api/v1/nope/", "/api/v2/"])
def test_an_api_path_matching_no_route_is_json_with_debug_on(
    org: Org, client_for: Any, settings: Any, path: str
) -> None:
    """Found by bench.fuzz with DEBUG on (as `make run` serves): Django's HTML debug 404,
    which lists every route, replaced the API's JSON 404."""
    settings.DEBUG = True
    response = client_for("pat").get(path)
    assert response.status_code == 404
    assert response.json() == {"detail": "Not found."}


def test_what_the_server_trims_or_bounds_the_schema_states(org: Org, client_for: Any) -> None:
    """Found by bench.fuzz: " " was a valid name by the schema (DRF trims it to blank), an
    integer filter past 64 bits valid, any string a valid webhook URL."""
    document = schema(client_for("pat"))
    project = document["components"]["schemas"]["ProjectCreateInRequest"]["properties"]["slug"]
    assert project["pattern"] and project["minLength"] == 1
    parameters = document["paths"]["/api/v1/approval-requests/"]["get"]["parameters"]
    tenant = next(p for p in parameters if p["name"] == "tenant")
    assert tenant["schema"]["maximum"] == 2**63 - 1
    url = document["components"]["schemas"]["PatchedTenantUpdateInRequest"]["properties"]
    assert url["webhook_url"]["oneOf"][0]["pattern"].startswith("^(https://")
    response = client_for("pat").patch(
        f"/api/v1/tenants/{org.alpha.pk}/", {"webhook_url": "0" * 40}, format="json"
    )
    assert "webhook_url" in response.json()["errors"]


def test_a_post_to_an_api_path_matching_no_route_is_a_json_404(org: Org) -> None:
    """Found by bench.fuzz: the catch-all route took CSRF checks, and answered a POST with
    Django's HTML 403."""
    from django.test import Client

    client = Client(enforce_csrf_checks=True)
    response = client.post("/api/v1/nodes/%C2%84/cordon/", {}, content_type="application/json")
    assert response.status_code == 404
    assert response.json() == {"detail": "Not found."}


def test_a_string_longer_than_its_max_length_is_400_even_with_trailing_spaces(
    org: Org, client_for: Any
) -> None:
    """Found by bench.fuzz: DRF trimmed the spaces before it counted, so a reason of 300
    characters and 10 spaces passed a maxLength of 300."""
    node = f.NodeFactory(name="n-long")
    body = {"reason": "x" * 300 + "\u00a0" * 10}
    response = client_for("pat").post(f"/api/v1/nodes/{node.pk}/cordon/", body, format="json")
    assert response.status_code == 400
    assert "reason" in response.json()["errors"]
    node.refresh_from_db()
    assert not node.cordoned


def test_a_cost_filter_past_64_bits_is_400(org: Org, client_for: Any) -> None:
    response = client_for("alice").get(f"/api/v1/costs/?tenant={2**63}")
    assert response.status_code == 400
    assert "tenant" in response.json()["errors"]
