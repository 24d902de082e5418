"""Image references read as Docker reads them, and allow-list entries matched on path
boundaries (tenants/registries.py): table cases, then hypothesis properties."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler.jobs.spec import IMAGE_RE
from tenants.registries import ImageName, allows, entry_normalise, image_name

DIGEST = "@sha256:" + "a" * 64


@pytest.mark.parametrize(
    ("reference", "host", "path"),
    [
        ("ubuntu", "docker.io", "library/ubuntu"),
        ("ubuntu:24.04", "docker.io", "library/ubuntu"),
        ("pytorch/pytorch:2.4", "docker.io", "pytorch/pytorch"),
        ("docker.io/pytorch/pytorch", "docker.io", "pytorch/pytorch"),
        ("docker.io/ubuntu", "docker.io", "library/ubuntu"),
        ("index.docker.io/library/ubuntu", "docker.io", "library/ubuntu"),
        ("nvcr.io/nvidia/pytorch:24.05-py3", "nvcr.io", "nvidia/pytorch"),
        ("localhost:5000/x", "localhost:5000", "x"),
        ("localhost:5000/x:1.0", "localhost:5000", "x"),
        ("localhost/team/x", "localhost", "team/x"),
        ("Registry.Example.com/team/train:1.2", "registry.example.com", "team/train"),
        ("registry.example.com:8443/a/b/c" + DIGEST, "registry.example.com:8443", "a/b/c"),
        ("ubuntu:22.04" + DIGEST, "docker.io", "library/ubuntu"),
        # A first component without a dot, a port or "localhost" is a Docker Hub user.
        ("nvidia/cuda:12.4", "docker.io", "nvidia/cuda"),
    ],
)
def test_image_references_are_read_as_docker_reads_them(
    reference: str, host: str, path: str
) -> None:
    assert IMAGE_RE.match(reference)  # the spec accepts it: these are real submissions
    assert image_name(reference) == ImageName(host, path)


@pytest.mark.parametrize(
    ("entry", "image", "allowed"),
    [
        ("nvcr.io/nvidia", "nvcr.io/nvidia/pytorch:24.05-py3", True),
        ("nvcr.io/nvidia", "nvcr.io/nvidiaevil/x", False),
        ("nvcr.io/nvidia", "nvcr.io/nvidia", True),
        ("nvcr.io", "nvcr.io/anything/at/all", True),
        ("nvcr.io", "nvcr.io.evil.com/x", False),
        ("docker.io/pytorch", "pytorch/pytorch:2.4", True),
        ("docker.io/pytorch", "pytorchevil/pytorch", False),
        ("docker.io/library", "ubuntu", True),
        ("docker.io", "ubuntu", True),
        ("registry.example.com", "registry.example.com:5000/x", False),
        ("localhost:5000", "localhost:5000/x", True),
        ("localhost:5000", "localhost:50001/x", False),
    ],
)
def test_an_entry_allows_images_below_it_on_path_boundaries(
    entry: str, image: str, allowed: bool
) -> None:
    assert allows(entry_normalise(entry), image_name(image)) is allowed


@pytest.mark.parametrize(
    ("entry", "normalised"),
    [
        ("nvcr.io/nvidia/", "nvcr.io/nvidia"),
        ("  NVCR.io/nvidia ", "nvcr.io/nvidia"),
        ("index.docker.io/pytorch", "docker.io/pytorch"),
        ("localhost:5000", "localhost:5000"),
    ],
)
def test_entries_are_normalised(entry: str, normalised: str) -> None:
    assert entry_normalise(entry) == normalised


@pytest.mark.parametrize(
    "entry",
    [
        "pytorch",
        "pytorch/pytorch",
        "nvcr.io/nvidia/pytorch:24.05",
        "nvcr.io@sha256:aa",
        "",
        "a b.io",
    ],
)
def test_an_entry_without_a_registry_host_or_with_a_tag_is_refused(entry: str) -> None:
    with pytest.raises(ValueError, match=r"registry|tag"):
        entry_normalise(entry)


def _example(entry: str) -> str:
    """The example a refusal for a missing registry host gives ("... (e.g. X or ...")."""
    with pytest.raises(ValueError, match="does not start with a registry host") as refusal:
        entry_normalise(entry)
    return str(refusal.value).rsplit("(e.g. ", 1)[1].split(" or ", 1)[0]


@pytest.mark.parametrize(
    ("entry", "example"),
    [
        ("pytorch", "docker.io/pytorch"),
        ("myteam/models", "docker.io/myteam/models"),
        ("not a host!!", "docker.io/pytorch"),  # "docker.io/not a host!!" is no entry
        ("PyTorch", "docker.io/pytorch"),
        ("a" * 41, "docker.io/pytorch"),  # cut short, it would name another account
    ],
    ids=["a-hub-account", "a-hub-path", "not-a-name", "upper-case", "too-long"],
)
def test_the_refusal_of_an_entry_without_a_host_gives_a_valid_example(
    entry: str, example: str
) -> None:
    assert _example(entry) == example
    assert entry_normalise(example) == example


# --- properties --------------------------------------------------------------------------

label = st.from_regex(r"[a-z0-9]{1,8}", fullmatch=True)
component = st.from_regex(r"[a-z0-9]{1,6}(?:[._-][a-z0-9]{1,4})?", fullmatch=True)
hosts = st.one_of(
    st.builds(lambda a, b: f"{a}.{b}", label, label),
    st.just("localhost"),
    st.builds(
        lambda h, port: f"{h}:{port}",
        st.sampled_from(["localhost", "reg.io"]),
        st.integers(1, 65535),
    ),
)
paths = st.lists(component, min_size=1, max_size=4).map("/".join)
tags = st.one_of(st.just(""), st.from_regex(r":[A-Za-z0-9_][A-Za-z0-9_.-]{0,10}", fullmatch=True))
digests = st.one_of(st.just(""), st.just(DIGEST))


@given(host=hosts, path=paths, tag=tags, digest=digests)
def test_a_reference_with_a_registry_names_that_registry_and_path(
    host: str, path: str, tag: str, digest: str
) -> None:
    reference = f"{host}/{path}{tag}{digest}"
    assert IMAGE_RE.match(reference)
    expected_path = f"library/{path}" if host == "docker.io" and "/" not in path else path
    assert image_name(reference) == ImageName(host, expected_path)


@given(path=paths, tag=tags, digest=digests)
def test_a_reference_without_a_registry_is_docker_hubs(path: str, tag: str, digest: str) -> None:
    first = path.split("/")[0]
    if "." in first or first == "localhost":  # names a registry: the property above
        return
    name = image_name(f"{path}{tag}{digest}")
    assert name.host == "docker.io"
    assert name.path == (path if "/" in path else f"library/{path}")
    # Written out in full, it is the same repository.
    assert image_name(f"docker.io/{name.path}") == name


@given(host=hosts, path=paths, tag=tags, digest=digests)
def test_normalising_twice_changes_nothing(host: str, path: str, tag: str, digest: str) -> None:
    name = image_name(f"{host}/{path}{tag}{digest}")
    assert image_name(name.repository) == name


@given(host=hosts, path=paths, prefix_len=st.integers(0, 4), extra=component)
def test_an_entry_allows_exactly_the_repositories_below_it(
    host: str, path: str, prefix_len: int, extra: str
) -> None:
    parts = path.split("/")
    entry = "/".join([host, *parts[:prefix_len]])
    image = image_name(f"{host}/{path}")
    image_parts = image.repository.split("/")
    assert allows(entry_normalise(entry), image) is (
        image_parts[: len(entry.split("/"))] == entry.split("/")
    )
    # The same entry followed by more characters in its last component never allows it.
    assert not allows(entry_normalise(entry), image_name(f"{entry}{extra}x/{path}"))


@given(entry=st.text(max_size=60))
def test_every_example_a_refusal_gives_is_an_entry(entry: str) -> None:
    try:
        entry_normalise(entry)
    except ValueError as refusal:
        if "does not start with a registry host" in str(refusal):
            example = _example(entry)
            assert entry_normalise(example) == example
