"""The scheduling profile page: platform admins see the profile in force, its file, when it
was loaded and what was refused; nobody else sees it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.urls import reverse

from scheduler.profiles.files import built_in, read_profile
from scheduler.profiles.record import profile_record_loaded, profile_record_refused

URL = reverse("portal:scheduler-profile")


def test_platform_admins_see_the_profile_in_force(web_for: Any, tmp_path: Path) -> None:
    path = tmp_path / "tuned.yaml"
    path.write_text(
        "apiVersion: gantry.io/v1\nkind: SchedulingProfile\nname: tuned\n"
        "preemption: {min_runtime_s: 0}\n"
    )
    profile_record_loaded(loaded=built_in(), holder="sched-a")
    loaded = read_profile(path)
    profile_record_loaded(loaded=loaded, holder="sched-b")
    profile_record_refused(
        path=str(path), sha256="f" * 64, errors=[("fair_share.half_life_s", "must be > 0, got 0")]
    )
    response = web_for("pat").get(URL)
    assert response.status_code == 200
    page = response.content.decode()
    assert "In force: <code>tuned</code>" in page
    assert str(path) in page and "sched-b" in page and loaded.sha256[:12] in page
    assert "min_runtime_s: 0.0" in page  # the settings, all of them, as YAML
    assert "fair_share.half_life_s</code>: must be &gt; 0, got 0" in page
    assert "(built-in) → <code>tuned</code>" in page  # the change, from the audit log
    assert f'href="{URL}"' in page  # in the navigation


def test_before_any_daemon_recorded_the_page_says_so(web_for: Any) -> None:
    response = web_for("pat").get(URL)
    assert response.status_code == 200
    assert "No scheduler has recorded its profile yet" in response.content.decode()


@pytest.mark.parametrize("persona", ["alice", "tina", "dana", "carol"])
def test_nobody_else_sees_the_profile(web_for: Any, persona: str) -> None:
    profile_record_loaded(loaded=built_in(), holder="sched-a")
    assert web_for(persona).get(URL).status_code == 403
    assert URL not in web_for(persona).get(reverse("portal:home")).content.decode()
