"""The capacity page: finance's pools with the band, saturation, drivers and options; a
department admin's subtree only; a member's 403; the export; finance's TCO form, and a refused
form shown again as typed with the error beside its field."""

from __future__ import annotations

import html
import io
import re

import pytest
from django.test import Client
from django.urls import reverse
from openpyxl import load_workbook

from capacity.models import TcoInputs
from tests.capacity.builders import stored_run

pytestmark = pytest.mark.django_db

PAGE = reverse("portal:capacity")
TCO = {
    "purchase_price": "24000",
    "depreciation_months": "36",
    "power_cooling_per_gpu_hour": "0.2",
    "hosting_support_per_month": "100",
    "on_demand_per_gpu_hour": "2.5",
    "committed_per_gpu_hour": "1.8",
}


def field_errors(page: str, form: str, field: str) -> str:
    """One field of one of the page's forms, with its label and errors ('' when it has none)."""
    found = re.search(
        rf'<div class="field has-error" id="{form}-field-{field}">.*?</div>\s*</div>', page, re.S
    )
    return html.unescape(found.group(0)) if found else ""


@pytest.fixture
def web(org):
    stored_run(org)

    def make(username: str) -> Client:
        client = Client()
        client.force_login(org.users[username])
        return client

    return make


def test_finance_sees_the_pool_and_compares_buying_with_renting(org, web) -> None:
    client = web("carol")
    saved = client.post(reverse("portal:capacity-tco"), {"flavor": org.h100.pk, **TCO})
    assert saved.status_code == 302 and TcoInputs.objects.count() == 1
    page = client.get(PAGE, {"gpus": "8"}).content.decode()
    assert "Full on 2026-12-16" in page
    assert 'id="options-1"' in page and "+8 GPUs" in page
    assert "Buy: owning" in page and "Rent on demand" in page and "Owning pays off" in page
    assert "46% utilization" in page  # break-even, explained beside it
    assert "team-alpha" in page  # the first driver
    assert 'data-figure="figure-capacity-0"' in page


def test_a_department_admin_sees_their_subtree_and_not_the_pool(web) -> None:
    response = web("dana").get(PAGE)
    page = response.content.decode()
    assert response.status_code == 200
    assert "H100-80GB &middot; research" in page
    assert "team-charlie" not in page and "Full on" not in page
    assert 'id="tco-form"' not in page


def test_a_member_gets_403_and_no_link(web) -> None:
    client = web("alice")
    assert client.get(PAGE).status_code == 403
    assert client.get(reverse("portal:capacity-export")).status_code == 403
    assert 'href="/capacity/"' not in client.get(reverse("portal:home")).content.decode()
    assert 'href="/capacity/"' in web("carol").get(reverse("portal:home")).content.decode()


def test_bad_query_is_400_and_says_why(web) -> None:
    response = web("carol").get(PAGE, {"gpus": "lots"})
    assert response.status_code == 400
    assert "The query is not valid" in response.content.decode()
    assert web("carol").get(reverse("portal:capacity-export"), {"format": "pdf"}).status_code == 400


def test_bad_tco_inputs_save_nothing_and_say_which_field(org, web) -> None:
    client = web("carol")
    bad = {"flavor": org.h100.pk, **TCO, "depreciation_months": "0"}
    response = client.post(reverse("portal:capacity-tco"), bad, follow=True)
    assert "depreciation_months" in response.content.decode()
    assert not TcoInputs.objects.exists()
    assert (
        web("dana").post(reverse("portal:capacity-tco"), {"flavor": org.h100.pk, **TCO}).status_code
        == 404
    )
    assert not TcoInputs.objects.exists()


def test_the_page_exports_what_it_shows(web) -> None:
    response = web("carol").get(reverse("portal:capacity-export"), {"format": "xlsx"})
    assert response["Content-Disposition"].endswith('.xlsx"')
    book = load_workbook(io.BytesIO(response.content))
    figures = list(book["Figures"].iter_rows(values_only=True))
    assert figures[3][:4] == ("H100-80GB", None, "saturation_p50", "2026-12-16")


def test_a_platform_admin_starts_an_expansion_from_the_page(org, web) -> None:
    from tests.whatif.builders import eight_gpu_node
    from whatif.models import WhatIf

    eight_gpu_node()
    client = web("pat")
    assert 'id="expansion-form"' in client.get(PAGE).content.decode()
    assert 'id="expansion-form"' not in web("carol").get(PAGE).content.decode()
    form = {
        "action": "add",
        "gpus": "8",
        "flavor": "H100-80GB",
        "window_days": "1",
        "at_day": "90",
        "from_pool": "",
        "to_pool": "",
    }
    response = client.post(reverse("portal:capacity-expansion"), form)
    run = WhatIf.objects.get()
    assert response.status_code == 302 and response["Location"] == f"/what-ifs/{run.pk}/"
    page = client.get(response["Location"]).content.decode()
    assert "add 8 GPUs of H100-80GB" in page
    bad = client.post(reverse("portal:capacity-expansion"), {**form, "gpus": "0"})
    assert bad.status_code == 400 and WhatIf.objects.count() == 1
    assert "greater than or equal to 1" in field_errors(bad.content.decode(), "expansion", "gpus")
    assert web("carol").post(reverse("portal:capacity-expansion"), form).status_code == 403


def test_finance_suggests_rejects_and_accepts_a_rate(org, web) -> None:
    from billing.models import RateCard
    from capacity.models import PoolTarget, RateSuggestion

    carol, pat = web("carol"), web("pat")
    carol.post(reverse("portal:capacity-tco"), {"flavor": org.h100.pk, **TCO})
    suggest = {"flavor": org.h100.pk, "target_utilization": "0.8"}
    assert carol.post(reverse("portal:capacity-suggest"), suggest).status_code == 302
    first = RateSuggestion.objects.get()
    page = carol.get(PAGE).content.decode()
    assert "1.5310" in page and 'value="reject"' in page and 'value="accept"' in page
    decide = reverse("portal:capacity-suggestion-decide", kwargs={"pk": first.pk})
    no_reason = carol.post(decide, {"decision": "reject"}, follow=True).content.decode()
    assert "reason: say why" in no_reason
    carol.post(decide, {"decision": "reject", "reason": "too low"})
    assert RateSuggestion.objects.get(pk=first.pk).state == "rejected"

    pat.post(reverse("portal:capacity-suggest"), suggest)
    second = RateSuggestion.objects.get(state="pending")
    decide = reverse("portal:capacity-suggestion-decide", kwargs={"pk": second.pk})
    assert 'value="accept"' in pat.get(PAGE).content.decode()
    assert carol.post(decide, {"decision": "accept"}).status_code == 302  # finance owns prices
    card = RateCard.objects.get()
    assert card.gpu_hour == second.gpu_hour and card.created_by.username == "carol"
    assert web("dana").post(decide, {"decision": "reject", "reason": "x"}).status_code == 404

    target = {"flavor": org.h100.pk, "target_utilization": "0.7"}
    assert carol.post(reverse("portal:capacity-target"), target).status_code == 403
    pat.post(reverse("portal:capacity-target"), target)
    assert float(PoolTarget.objects.get().target_utilization) == 0.7
    assert "Full on" in pat.get(PAGE).content.decode()


@pytest.mark.parametrize(
    ("route", "form", "api", "persona", "body", "field"),
    [
        (
            "capacity-target",
            "target",
            "targets",
            "pat",
            {"target_utilization": "1.5"},
            "target_utilization",
        ),
        (
            "capacity-suggest",
            "suggest",
            "rate-suggestions",
            "carol",
            {"target_utilization": "0"},
            "target_utilization",
        ),
        (
            "capacity-tco",
            "tco",
            "tco-inputs",
            "carol",
            {**TCO, "purchase_price": "-1"},
            "purchase_price",
        ),
    ],
    ids=["target", "suggestion", "tco"],
)
def test_the_page_and_the_api_refuse_a_bad_value_in_the_same_words(
    org, web, client_for, route, form, api, persona, body, field
) -> None:
    # One check (capacity/api/submissions.py) behind both: the page's message is the API's 400.
    from capacity.models import PoolTarget, RateSuggestion

    sent = {"flavor": org.h100.pk, **body}
    as_json = {k: int(v) if k == "depreciation_months" else v for k, v in sent.items()}
    answer = client_for(persona).post(f"/api/v1/capacity/{api}/", as_json, format="json")
    assert answer.status_code == 400
    said = " ".join(answer.json()["errors"][field])
    page = web(persona).post(reverse(f"portal:{route}"), sent)
    assert page.status_code == 400
    assert said in field_errors(page.content.decode(), form, field)
    assert not (PoolTarget.objects.exists() or RateSuggestion.objects.exists())
    assert not TcoInputs.objects.exists()


def test_a_refused_tco_form_comes_back_as_typed_with_the_error_beside_its_field(org, web) -> None:
    typed = {"flavor": org.h100.pk, **TCO, "power_cooling_per_gpu_hour": "abc"}
    response = web("carol").post(reverse("portal:capacity-tco"), typed)
    page = response.content.decode()
    assert response.status_code == 400 and not TcoInputs.objects.exists()
    errors = field_errors(page, "tco", "power_cooling_per_gpu_hour")
    assert "Power and cooling per GPU-hour" in errors and "must be a decimal number" in errors
    assert "power_cooling_per_gpu_hour:" not in page  # the API's name for it, not its label
    form = page[page.index('id="tco-form"') :]
    for name, value in {**TCO, "power_cooling_per_gpu_hour": "abc"}.items():
        assert f'name="{name}" value="{value}"' in form, name
    assert f'<option value="{org.h100.pk}" selected>' in form
    # The page's other forms are there, empty, and the page around them as on a GET.
    assert 'id="suggest-form"' in page and 'id="figure-capacity-0"' in page


@pytest.mark.parametrize(
    ("field", "value", "said"),
    [
        ("gpus", "-3", "greater than or equal to 1"),
        ("at_day", "-1", "greater than or equal to 1"),
        ("window_days", "0", "greater than or equal to 1"),
        ("gpus", "many", "Enter a whole number."),
    ],
    ids=["negative-gpus", "negative-day", "no-days", "not-a-number"],
)
def test_a_refused_expansion_says_what_is_wrong_with_the_number(
    org, web, field, value, said
) -> None:
    from whatif.models import WhatIf

    form = {"action": "add", "gpus": "8", "flavor": "H100-80GB", "window_days": "1"}
    response = web("pat").post(reverse("portal:capacity-expansion"), {**form, field: value})
    page = response.content.decode()
    assert response.status_code == 400 and not WhatIf.objects.exists()
    assert said in field_errors(page, "expansion", field)
    assert "got a string" not in page
    assert f'name="{field}" value="{value}"' in page


def test_a_refused_target_comes_back_as_typed_beside_its_label(org, web) -> None:
    from capacity.models import PoolTarget

    typed = {"flavor": org.h100.pk, "target_utilization": "most"}
    response = web("pat").post(reverse("portal:capacity-target"), typed)
    errors = field_errors(response.content.decode(), "target", "target_utilization")
    assert response.status_code == 400 and not PoolTarget.objects.exists()
    assert "Full at utilization" in errors and "must be a decimal number" in errors
    assert 'value="most"' in errors
