from typing import Any

from tests.conftest import Org, job_spec


def test_member_submits_and_sees_own_job(org: Org, client_for: Any) -> None:
    client = client_for("alice")
    response = client.post(
        "/api/v1/jobs/", {"project": org.proj_alpha.pk, "spec": job_spec()}, format="json"
    )
    assert response.status_code == 201, response.json()
    job = response.json()
    assert job["state"] == "queued"
    assert job["priority_class"] == "normal"
    assert job["gpus_total"] == 8
    listed = client.get("/api/v1/jobs/").json()
    assert [j["id"] for j in listed["results"]] == [job["id"]]
