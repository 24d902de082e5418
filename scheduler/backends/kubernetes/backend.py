"""The Kubernetes cluster backend: the official client, the Binding API, graceful preemption.

Gantry is the scheduler of pods with `schedulerName: gantry`: it creates them already on the
node it chose (`spec.nodeName`, one call per pod), or, with `create_bound` off, unbound and then
bound through the Binding API (`pods/binding`), as kube-scheduler does. Every try of every
request but the watches takes a token of the client-side rate first (`api_qps`, `api_burst`);
the daemon keeps up to `max_in_flight` writes in flight from its threads. Requests go out
with `_preload_content=False` and the JSON is parsed here, for two reasons: inventories of
thousands of nodes parse much faster as dicts than as client models, and client v37 cannot
deserialize the Status object the apiserver answers to a successful bind (it expects a
V1Binding and raises a pydantic ValueError after the bind has happened).

Errors: transient failures are retried a few times (kubernetes_retry) and then raised as
BackendError; binding races are BindConflict; a request the apiserver refuses for good is
ApiRejected (a BackendError with the status); a request that cannot be rendered safely is
UnsafePodSpec (a BackendError and a ValueError). No client exception leaves the Protocol.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import random
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from datetime import UTC, datetime
from typing import Any, TypeVar, cast

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from scheduler.backends.base import (
    BackendError,
    BindConflict,
    LogLine,
    LogPage,
    LogTarget,
    NodeInfo,
    PodRequest,
    PodStatus,
)
from scheduler.backends.kubernetes import logs as kubernetes_logs
from scheduler.backends.kubernetes.config import KubernetesConfig
from scheduler.backends.kubernetes.held import HeldCaches
from scheduler.backends.kubernetes.informer import NodeInformer, PodInformer
from scheduler.backends.kubernetes.inventory import node_info
from scheduler.backends.kubernetes.namespaces import NamespaceContents
from scheduler.backends.kubernetes.render import (
    LABEL_HELD,
    LABEL_MANAGED,
    held_pod_admission,
    is_adoptable,
    render_event,
    render_pod,
    render_service,
)
from scheduler.backends.kubernetes.resume import resume_patch
from scheduler.backends.kubernetes.status import pod_status
from scheduler.backends.kubernetes.transient import call_with_retry, describe
from scheduler.backends.kubernetes.watch import ListFn, ListWatcher, StreamFn
from scheduler.backends.rate import TokenBucket
from scheduler.backends.retry import RetryPolicy, WriteFence
from scheduler.backends.workloads import JOB, RESUMABLE, Resumable, parse_ref

logger = logging.getLogger(__name__)
F = TypeVar("F", bound=Callable[..., Any])
CONFLICT, NOT_FOUND = 409, 404
# An answer of the object's metadata alone (the API server's server-side transformation).
METADATA_ONLY = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"
JSON_PATCH = "application/json-patch+json"
# Namespaces the daemon creates for projects enforce the restricted Pod Security Standard.
PSS_LABELS = {
    "pod-security.kubernetes.io/enforce": "restricted",
    "pod-security.kubernetes.io/enforce-version": "latest",
    "pod-security.kubernetes.io/audit": "restricted",
    "pod-security.kubernetes.io/warn": "restricted",
}


class ForeignPod(BindConflict):
    """A pod holds our deterministic name but is not the pod we render: never adopt it."""


class ForeignNamespace(BackendError):
    """A project's namespace exists but Gantry did not create it: jobs never run there."""


class ApiRejected(BackendError):
    """The apiserver refused a request for good (403, 422, an unexplained 409, ...).

    A BackendError so that the daemon's handling of failed calls applies (the job goes back
    to the queue with backoff); `status` and the chained ApiException say what it was.
    """

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


def _protocol_errors(method: F) -> F:
    """ClusterBackend methods raise BackendError or BindConflict, never a client exception."""

    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return method(*args, **kwargs)
        except ApiException as exc:
            raise ApiRejected(describe(exc), exc.status or 0) from exc

    return cast(F, wrapper)


def _pooled(api_client: client.ApiClient, config: KubernetesConfig) -> client.ApiClient:
    """`api_client`, its connection pools made to hold the daemon's writes in flight and a few
    reads beside them: a smaller pool opens and drops a connection per call once it is full.
    The pools of a host are made at its first request, from the manager's settings."""
    wanted = config.max_in_flight + 4
    if (api_client.configuration.connection_pool_maxsize or 0) < wanted:
        api_client.configuration.connection_pool_maxsize = wanted
        manager = api_client.rest_client.pool_manager
        manager.connection_pool_kw["maxsize"] = wanted
        manager.clear()  # a pool made before this keeps its size: the next request makes another
    return api_client


def api_client_from_environment() -> client.ApiClient:
    """In-cluster service account, else KUBECONFIG / ~/.kube/config. The client's global
    default configuration is left alone."""
    from kubernetes import config as kube_config

    configuration = client.Configuration()
    try:
        kube_config.load_incluster_config(client_configuration=configuration)
    except kube_config.ConfigException:
        # Read KUBECONFIG now: the client reads it once, when it is imported.
        path = os.environ.get("KUBECONFIG") or None
        kube_config.load_kube_config(config_file=path, client_configuration=configuration)
    configuration.retries = False  # retries are ours: bounded, with jitter (kubernetes_retry)
    return client.ApiClient(configuration)


class KubernetesBackend(NamespaceContents):
    """ClusterBackend over a Kubernetes apiserver. Thread-safe as the client is."""

    def __init__(
        self,
        api_client: client.ApiClient | None = None,
        config: KubernetesConfig | None = None,
        *,
        policy: RetryPolicy | None = None,
        sleep: Callable[[float], None] = time.sleep,
        rand: Callable[[], float] = random.random,
    ) -> None:
        self.config = config or KubernetesConfig.from_env()
        self.api_client = _pooled(api_client or api_client_from_environment(), self.config)
        self.core = client.CoreV1Api(self.api_client)
        # A project namespace's NetworkPolicies and the web's log RoleBinding there.
        self.networking = client.NetworkingV1Api(self.api_client)
        self.rbac = client.RbacAuthorizationV1Api(self.api_client)
        # The Jobs users create, which Gantry admits and suspends (issue 37).
        self.batch = client.BatchV1Api(self.api_client)
        # The other kinds users create (JobSet, LeaderWorkerSet, RayJob, TrainJob).
        self.custom = client.CustomObjectsApi(self.api_client)
        self.policy = policy or RetryPolicy()
        self._sleep, self._rand = sleep, rand
        # Device resource per node (nvidia.com/gpu or an NPU's), from the last inventory.
        self._device_resource: dict[str, str] = {}
        self._watchers: list[ListWatcher[Any]] = []
        # Gantry's pods as the daemon's watch sees them (`watch_pods`): list_pods reads here;
        # and the nodes, which list_nodes reads while that watch is live.
        self.informer: PodInformer | None = None
        self.node_informer: NodeInformer | None = None
        # Namespaces seen to carry Gantry's label, so each is read once per process.
        self._own_namespaces: set[str] = set()
        self._fence = WriteFence()  # the daemon's lease fence, before every try of a write
        self.rate = TokenBucket(self.config.api_qps, self.config.api_burst)

    @property
    def max_in_flight(self) -> int:
        return self.config.max_in_flight

    @property
    def creates_bound(self) -> bool:
        return self.config.create_bound

    def fenced(self, check: Callable[[], None]) -> AbstractContextManager[None]:
        """While in the block, run `check` before every try of every write (create, bind,
        delete, patch): the daemon's lease fence, which raises once it no longer leads."""
        return self._fence.held(check)

    # -- plumbing ---------------------------------------------------------------------------

    def _call(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """One API call with retries; returns the parsed JSON body (or None when empty).
        Each try of a write is fenced first (`fenced`); reads are not."""

        def once() -> Any:
            self.rate.take()
            response = fn(*args, _preload_content=False, _request_timeout=self._timeout(), **kwargs)
            try:
                body = response.data
            finally:
                response.release_conn()
            return json.loads(body) if body else None

        reads = getattr(fn, "__name__", "").startswith(("read_", "list_", "get_"))
        return call_with_retry(
            once,
            self.policy,
            sleep=self._sleep,
            rand=self._rand,
            what=what,
            before_try=None if reads else self._fence.check,
        )

    def _timeout(self) -> tuple[float, float]:
        return (self.config.request_timeout_s, self.config.request_timeout_s)

    def _pages(self, what: str, fn: Callable[..., Any], **kwargs: Any) -> tuple[list[Any], str]:
        """Every item of a paginated list, and the list's resourceVersion."""
        items: list[Any] = []
        token: str | None = None
        while True:
            page = self._call(what, fn, limit=self.config.page_size, _continue=token, **kwargs)
            items.extend(page.get("items") or ())
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                return items, str((page.get("metadata") or {}).get("resourceVersion", ""))

    # -- inventory --------------------------------------------------------------------------

    @_protocol_errors
    def list_nodes(self) -> Sequence[NodeInfo]:
        """From the node watch's cache while it is live (the daemon's watches run), else
        listed from the API server."""
        if self.node_informer is not None and (cached := self.node_informer.nodes()) is not None:
            return cached
        items, _ = self._pages("list nodes", self.core.list_node)
        return [self._remember(node_info(item, self.config)) for item in items]

    @_protocol_errors
    def get_node(self, name: str) -> NodeInfo | None:
        """One node, fresh (after a kubelet rejection, docs/faults.md 14); None when it is gone."""
        try:
            raw = self._call(f"read node {name}", self.core.read_node, name)
        except ApiException as exc:
            if exc.status == NOT_FOUND:
                self._device_resource.pop(name, None)
                return None
            raise
        return self._remember(node_info(raw, self.config))

    def _remember(self, node: NodeInfo) -> NodeInfo:
        npu = {flavor: resource for resource, (flavor, _) in self.config.npu_resources.items()}
        self._device_resource[node.name] = npu.get(node.flavor, self.config.gpu_resource)
        return node

    @_protocol_errors
    def set_node_unschedulable(self, node: str, unschedulable: bool) -> None:
        body = {"spec": {"unschedulable": unschedulable}}
        answer = self._call(f"cordon {node}", self.core.patch_node, node, body)
        if self.node_informer is not None and isinstance(answer, dict):  # read your writes
            rv = (answer.get("metadata") or {}).get("resourceVersion")
            self.node_informer.changed("MODIFIED", node_info(answer, self.config), rv)

    # -- pods -------------------------------------------------------------------------------

    @_protocol_errors
    def create_pod(self, pod: PodRequest) -> None:
        """Create the pod on its node (`create_bound`) or unbound; adopt ours under the same
        name (one found unbound is bound now; one on another node is a BindConflict); then its
        Service if any."""
        if pod.held:
            self._admit_held(pod)
            return
        if pod.workload:
            if pod.replica == 0:  # one admission for the whole object
                self.admit_workload(pod)
            return
        bound = self.config.create_bound
        manifest = render_pod(pod, self.config, self._device_resource.get(pod.node), bound=bound)
        created, adopted = self._create_or_adopt(pod, manifest)
        self._wrote(created)
        if bound and adopted:  # one we created now is on its node: the manifest's
            node = (created.get("spec") or {}).get("nodeName")
            if not node:  # ours, created unbound before (another setting, an older version)
                self.bind_pod(pod.namespace, pod.name, pod.node)
            elif node != pod.node:
                raise BindConflict(f"{pod.namespace}/{pod.name} is bound to {node}", node)
        if pod.replicas > 1 and pod.replica == 0:
            self._ensure_service(pod, created)

    def _admit_held(self, pod: PodRequest) -> None:
        """Admit a pod its user created, held by Gantry's gate (issue 37): Gantry's labels
        and devices on it and the gate removed (one patch), then bound to its node. A pod
        already admitted is only bound; one gone, made again under its name (another uid than
        its job recorded), or on another node, is a BindConflict."""
        existing = self._read_pod(pod.namespace, pod.name)
        if existing is None:
            raise BindConflict(f"{pod.namespace}/{pod.name} is gone", deleting=True)
        uid = (existing.get("metadata") or {}).get("uid")
        if pod.held_uid and uid != pod.held_uid:
            # Not ours: never deleted by us (the daemon leaves a foreign pod alone).
            raise ForeignPod(f"{pod.namespace}/{pod.name} was made again: a new workload's pod")
        ops = held_pod_admission(existing, pod)
        if ops:
            try:
                existing = dict(
                    self._call(
                        f"admit pod {pod.name}",
                        self.core.patch_namespaced_pod,
                        pod.name,
                        pod.namespace,
                        ops,
                    )
                )
            except ApiException as exc:
                if exc.status == NOT_FOUND:
                    raise BindConflict(
                        f"{pod.namespace}/{pod.name} is gone", deleting=True
                    ) from exc
                raise
            self._wrote(existing)
        node = (existing.get("spec") or {}).get("nodeName")
        if not node:
            self.bind_pod(pod.namespace, pod.name, pod.node)
        elif node != pod.node:
            raise BindConflict(f"{pod.namespace}/{pod.name} is bound to {node}", node)

    @_protocol_errors
    def admit_workload(self, pod: PodRequest) -> None:
        """Admit the object `pod.workload` names (a Job, JobSet, RayJob, TrainJob or
        PyTorchJob a user created, issue 37): Gantry's labels on its pod templates (the job's,
        so its controller's pods are Gantry's to bind; put on once) and unsuspended, in one
        patch (`resume.resume_patch`). One gone is a BindConflict (its job is not run)."""
        kind, name = parse_ref(pod.workload)
        try:
            obj = self._call(
                f"read {kind.kind} {name}", *self._read_object(kind, pod.namespace, name)
            )
        except ApiException as exc:
            if exc.status == NOT_FOUND:
                raise BindConflict(
                    f"{kind.kind} {pod.namespace}/{name} is gone", deleting=True
                ) from exc
            raise
        ops = resume_patch(kind, obj, pod, self.config.gpu_resource)
        self._call(f"admit {kind.kind} {name}", *self._patch_object(kind, pod.namespace, name, ops))

    @_protocol_errors
    def suspend_workload(self, namespace: str, workload: str) -> None:
        """Suspend the object `workload` names again (its job was preempted, cancelled or
        failed in Gantry): its controller deletes its pods and makes none until admitted
        again. One gone is no error."""
        kind, name = parse_ref(workload)
        patch = [{"op": "replace", "path": kind.suspend_pointer, "value": True}]
        try:
            self._call(
                f"suspend {kind.kind} {name}", *self._patch_object(kind, namespace, name, patch)
            )
        except ApiException as exc:
            if exc.status != NOT_FOUND:
                raise

    def _read_object(self, kind: Resumable, namespace: str, name: str) -> tuple[Any, ...]:
        """The client call (function and arguments) that reads an object of `kind`."""
        if kind == JOB:
            return (self.batch.read_namespaced_job, name, namespace)
        get = self.custom.get_namespaced_custom_object
        return (get, kind.group, kind.version, namespace, kind.plural, name)

    def _patch_object(
        self, kind: Resumable, namespace: str, name: str, ops: list[dict[str, Any]]
    ) -> tuple[Any, ...]:
        """The client call that applies the JSON patch `ops` to an object of `kind`."""
        if kind == JOB:
            return (self.batch.patch_namespaced_job, name, namespace, ops)
        # The custom objects API sends a merge patch unless told: this is a JSON patch.
        patch = functools.partial(
            self.custom.patch_namespaced_custom_object, _content_type=JSON_PATCH
        )
        return (patch, kind.group, kind.version, namespace, kind.plural, name, ops)

    def _create_or_adopt(
        self, pod: PodRequest, manifest: dict[str, Any], again: bool = True
    ) -> tuple[dict[str, Any], bool]:
        """The created pod's metadata and False, or ours found under its name (whole) and
        True. `again`: one more try is allowed. The create asks for the answer's metadata
        alone (`as=PartialObjectMetadata`): the API server then encodes, and this process
        parses, a tenth of the pod, and the metadata (its version, for the informer; its uid,
        for the Service's owner) is all that is read of it."""
        self._require_own_namespace(pod.namespace)
        try:
            created = self._call(
                f"create pod {pod.name}",
                self.core.create_namespaced_pod,
                pod.namespace,
                manifest,
                _headers={"Accept": METADATA_ONLY},
            )
            return dict(created), False
        except ApiException as exc:
            if exc.status == NOT_FOUND and again:  # the project's namespace does not exist yet
                self.ensure_namespace(pod.namespace)
                return self._create_or_adopt(pod, manifest, again=False)
            if exc.status != CONFLICT:
                raise
        existing = self._read_pod(pod.namespace, pod.name)
        if existing is None and again:  # deleted between our create and our read
            return self._create_or_adopt(pod, manifest, again=False)
        # Ours whatever its node: create_pod checks the node of what it adopts.
        spec = {k: v for k, v in manifest["spec"].items() if k != "nodeName"}
        if existing is None or not is_adoptable(existing, {**manifest, "spec": spec}):
            raise ForeignPod(f"{pod.namespace}/{pod.name} exists and is not Gantry's pod")
        logger.info("adopted existing pod %s/%s", pod.namespace, pod.name)
        return existing, True

    def _ensure_service(self, pod: PodRequest, owner: dict[str, Any]) -> None:
        """The headless Service, owned by replica 0 so the garbage collector removes it."""
        service = render_service(pod, self.config)
        uid = (owner.get("metadata") or {}).get("uid")
        if uid:
            service["metadata"]["ownerReferences"] = [
                {"apiVersion": "v1", "kind": "Pod", "name": pod.name, "uid": uid}
            ]
        try:
            self._call(
                f"create service of {pod.name}",
                self.core.create_namespaced_service,
                pod.namespace,
                service,
            )
        except ApiException as exc:
            if exc.status != CONFLICT:
                raise

    def _read_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return dict(
                self._call(f"read pod {name}", self.core.read_namespaced_pod, name, namespace)
            )
        except ApiException as exc:
            if exc.status == NOT_FOUND:
                return None
            raise

    @_protocol_errors
    def bind_pod(self, namespace: str, name: str, node: str) -> None:
        """Bind through pods/binding; an answer of 409 is resolved by reading the pod."""
        binding = client.V1Binding(
            api_version="v1",
            kind="Binding",
            metadata=client.V1ObjectMeta(name=name, namespace=namespace),
            target=client.V1ObjectReference(api_version="v1", kind="Node", name=node),
        )
        try:
            self._call(
                f"bind {name} to {node}",
                self.core.create_namespaced_pod_binding,
                name,
                namespace,
                binding,
            )
        except ApiException as exc:
            if exc.status not in (CONFLICT, NOT_FOUND):
                raise
            self._resolve_bind_conflict(namespace, name, node, exc)
        if self.informer is not None:
            self.informer.bound(namespace, name, node)

    def _resolve_bind_conflict(
        self, namespace: str, name: str, node: str, exc: ApiException
    ) -> None:
        pod = self._read_pod(namespace, name)
        if pod is None:
            raise BindConflict(f"{namespace}/{name} is gone", deleting=True) from exc
        bound = (pod.get("spec") or {}).get("nodeName")
        if (pod.get("metadata") or {}).get("deletionTimestamp"):
            raise BindConflict(f"{namespace}/{name} is being deleted", bound, True) from exc
        if bound == node:
            return  # our earlier bind landed (a retry after a lost answer, docs/faults.md 3 and 11)
        if bound:
            raise BindConflict(f"{namespace}/{name} is bound to {bound}", bound) from exc
        raise exc  # a 409 we cannot explain: not ours to swallow

    @_protocol_errors
    def delete_pod(self, namespace: str, name: str, grace_period_s: int = 30) -> None:
        """Graceful delete: the pod keeps its devices until the kubelet reports it gone."""
        try:
            deleted = self._call(
                f"delete pod {name}",
                self.core.delete_namespaced_pod,
                name,
                namespace,
                grace_period_seconds=grace_period_s,
                propagation_policy="Background",
            )
        except ApiException as exc:
            if exc.status != NOT_FOUND:
                raise
            return
        self._wrote(deleted)

    @_protocol_errors
    def list_pods(self) -> Sequence[PodStatus]:
        """From the informer's cache once it has seen this process's own writes (while the
        daemon's watch runs), else listed from the API server."""
        if self.informer is not None and (cached := self.informer.pods()) is not None:
            return cached
        items, _ = self._list_pod_items()
        return [status for item in items if (status := pod_status(item)) is not None]

    def failed_companions(self) -> Sequence[PodStatus]:
        """Companion pods the daemon's watch saw Failed that have gone since (deleting, or
        deleted) within the informer's `FAILED_GONE_S`: their failure is still to be told.
        Without the watch, none: a list shows only the pods still there."""
        return self.informer.failed_gone() if self.informer is not None else ()

    def _wrote(self, pod: Any) -> None:
        """A pod write's answer: reads from the informer wait until it has seen it."""
        if self.informer is not None and isinstance(pod, dict):
            self.informer.wrote((pod.get("metadata") or {}).get("resourceVersion"))

    def _list_pod_items(self) -> tuple[list[dict[str, Any]], str]:
        return self._pages(
            "list pods", self.core.list_pod_for_all_namespaces, **self._pod_selectors()
        )

    @_protocol_errors
    def list_held_pods(self) -> list[dict[str, Any]]:
        """Every pod Gantry's admission webhook held (label `gantry.io/managed=true`), in
        every namespace, as the API server returns them (the workload controller's read)."""
        items, _ = self._pages(
            "list held pods",
            self.core.list_pod_for_all_namespaces,
            label_selector=f"{LABEL_HELD}=true",
        )
        return items

    @_protocol_errors
    def list_held_jobs(self) -> list[dict[str, Any]]:
        """Every batch/v1 Job Gantry's admission webhook held, in every namespace."""
        items, _ = self._pages(
            "list held jobs",
            self.batch.list_job_for_all_namespaces,
            label_selector=f"{LABEL_HELD}=true",
        )
        return items

    @_protocol_errors
    def list_held_objects(self, group: str, version: str, plural: str) -> list[dict[str, Any]]:
        """Every object of a custom kind (JobSet, LeaderWorkerSet, RayJob, TrainJob) Gantry's
        webhook held, in every namespace; none where the API server does not serve the kind
        (its CRD is not installed: nobody can have created one)."""
        try:
            items, _ = self._pages(
                f"list held {plural}",
                self.custom.list_cluster_custom_object,
                group=group,
                version=version,
                plural=plural,
                label_selector=f"{LABEL_HELD}=true",
            )
        except ApiException as exc:
            if exc.status == NOT_FOUND:
                return []
            raise
        return items

    @_protocol_errors
    def read_training_runtime(self, namespace: str, kind: str, name: str) -> dict[str, Any] | None:
        """The training runtime a TrainJob names (the workload controller's read, issue 37):
        a ClusterTrainingRuntime, or a TrainingRuntime of `namespace`; None where it does not
        exist or the kind is not served. The namespaced one is listed by name, so that the
        controller's account alone needs to read runtimes (the daemon's `get` of custom
        objects is for the kinds it resumes)."""
        group, version = "trainer.kubeflow.org", "v1alpha1"
        try:
            if kind == "TrainingRuntime":
                items, _ = self._pages(
                    "list training runtimes",
                    self.custom.list_namespaced_custom_object,
                    group=group,
                    version=version,
                    namespace=namespace,
                    plural="trainingruntimes",
                    field_selector=f"metadata.name={name}",
                )
                return items[0] if items else None
            found: dict[str, Any] | None = self._call(
                f"get clustertrainingruntime {name}",
                self.custom.get_cluster_custom_object,
                group,
                version,
                "clustertrainingruntimes",
                name,
            )
            return found
        except ApiException as exc:
            if exc.status == NOT_FOUND:
                return None
            raise

    def held_list_watch(self, group: str, version: str, plural: str) -> tuple[ListFn, StreamFn]:
        """The list and the watch of the objects of one kind Gantry's webhook held (label
        `gantry.io/managed=true`, every namespace), for a list/watch loop (the workload
        controller's, `scheduler.workloads.watched`): `list_all()` -> (items, the list's
        resourceVersion), raising ApiRejected (a 404 where the kind is not served);
        `open_stream(resourceVersion, timeout_s)` -> the watch's raw response."""
        kwargs: dict[str, Any] = {"label_selector": f"{LABEL_HELD}=true"}
        fn: Callable[..., Any]
        if (group, plural) == ("", "pods"):
            fn = self.core.list_pod_for_all_namespaces
        elif (group, plural) == ("batch", "jobs"):
            fn = self.batch.list_job_for_all_namespaces
        else:
            fn = self.custom.list_cluster_custom_object
            kwargs |= {"group": group, "version": version, "plural": plural}

        @_protocol_errors
        def list_all() -> tuple[list[dict[str, Any]], str]:
            return self._pages(f"list held {plural}", fn, **kwargs)

        def open_stream(resource_version: str, timeout_s: int) -> Any:
            return self._open_stream(fn, resource_version, timeout_s, **kwargs)

        return list_all, open_stream

    def watch_held(self, *, clock: Callable[[], float], relist_s: float) -> HeldCaches:
        """The held objects of each kind, read from watches (`HeldCaches`, made as each kind
        is first read; `close()` ends them), each kind listed again every `relist_s` of
        `clock` (the daemon's sweep: `scheduler.daemon.strays`)."""
        return HeldCaches(self, clock=clock, relist_s=relist_s)

    def _pod_selectors(self) -> dict[str, str]:
        return {
            "field_selector": f"spec.schedulerName={self.config.scheduler_name}",
            "label_selector": f"{LABEL_MANAGED}=gantry",
        }

    def _require_own_namespace(self, name: str) -> None:
        """Create the project's namespace, or check that Gantry did: a namespace someone else
        made (another group's, without Pod Security labels) never gets a job's pods. A
        platform admin who assigns an existing namespace to a project labels it
        `app.kubernetes.io/managed-by=gantry` (docs/kubernetes.md)."""
        if name in self._own_namespaces:
            return
        try:
            found = self._call(f"read namespace {name}", self.core.read_namespace, name)
        except ApiException as exc:
            if exc.status != NOT_FOUND:
                raise
            self.ensure_namespace(name)
        else:
            labels = (found.get("metadata") or {}).get("labels") or {}
            if labels.get(LABEL_MANAGED) != "gantry":
                raise ForeignNamespace(
                    f"namespace {name!r} exists and was not created by Gantry (no "
                    f"{LABEL_MANAGED}=gantry label); a platform admin assigns it by adding "
                    "that label and the Pod Security labels"
                )
            # Made before Gantry shipped its policies, or assigned by an admin.
            self._provision_namespace(name)
        self._own_namespaces.add(name)

    @_protocol_errors
    def prepare_namespace(self, name: str) -> None:
        """A project's namespace made ahead of its first pod (`ProjectNamespaces`)."""
        self._require_own_namespace(name)

    @staticmethod
    def foreign(error: BackendError) -> bool:
        return isinstance(error, ForeignNamespace)

    @_protocol_errors
    def ensure_namespace(self, name: str, labels: dict[str, str] | None = None) -> None:
        """Create a project's namespace (restricted PSS) unless it exists, and what it holds
        besides pods (`_provision_namespace`)."""
        body = {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {
                "name": name,
                "labels": {LABEL_MANAGED: "gantry", **PSS_LABELS, **(labels or {})},
            },
        }
        try:
            self._call(f"create namespace {name}", self.core.create_namespace, body)
        except ApiException as exc:
            if exc.status != CONFLICT:
                raise
        self._provision_namespace(name)

    @_protocol_errors
    def record_event(
        self,
        namespace: str,
        pod: str,
        reason: str,
        message: str,
        warning: bool = False,
        about: tuple[str, str, str] = ("v1", "Pod", ""),
    ) -> None:
        """A core/v1 Event on a pod (`kubectl describe pod` shows it), e.g. why it waits, or
        on another object (`about`: its apiVersion, kind and uid)."""
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        body = render_event(namespace, pod, reason, message[:1024], warning, now, about)
        self._call(f"event on {pod}", self.core.create_namespaced_event, namespace, body)

    @_protocol_errors
    def annotate(
        self, namespace: str, name: str, about: tuple[str, str, str], annotations: dict[str, str]
    ) -> None:
        """Set `annotations` on an object a user created (`about`: its apiVersion, kind and
        uid: a pod, or a kind Gantry resumes), by a JSON merge patch that names nothing else:
        Gantry's status, which `kubectl get -o custom-columns` shows (issue 37). One gone is no
        error."""
        api_version, kind, _ = about
        body = {"metadata": {"annotations": annotations}}
        fn: Callable[..., Any]
        args: tuple[Any, ...] = (name, namespace)
        resumable = RESUMABLE.get(kind)
        if kind == "Pod":
            fn = self.core.patch_namespaced_pod
        elif resumable == JOB:
            fn = self.batch.patch_namespaced_job
        elif resumable is not None and api_version.partition("/")[0] == resumable.group:
            fn = self.custom.patch_namespaced_custom_object
            args = (resumable.group, resumable.version, namespace, resumable.plural, name)
        else:
            raise ValueError(f"Gantry annotates pods and the kinds it resumes, not {kind}")
        merge = functools.partial(fn, _content_type="application/merge-patch+json")
        try:
            self._call(f"annotate {kind} {name}", merge, *args, body)
        except ApiException as exc:
            if exc.status != NOT_FOUND:
                raise

    # -- logs (pods/log) ----------------------------------------------------------------

    @_protocol_errors
    def read_log(
        self, target: LogTarget, *, now: datetime, tail: int | None = None, cursor: str = ""
    ) -> LogPage:
        """LogSource.read_log through `read_namespaced_pod_log` (kubernetes_logs)."""

        def fetch(**query: Any) -> str:
            def once() -> str:
                # The raw urllib3 response (_preload_content=False), typed by the client as str.
                response: Any = self.core.read_namespaced_pod_log(
                    target.pod,
                    target.namespace,
                    _preload_content=False,
                    _request_timeout=self._timeout(),
                    **query,
                )
                try:
                    return bytes(response.data).decode(errors="replace")
                finally:
                    response.release_conn()

            return call_with_retry(
                once, self.policy, sleep=self._sleep, rand=self._rand, what=f"log of {target.pod}"
            )

        try:
            return kubernetes_logs.read_page(fetch, target, now=now, tail=tail, cursor=cursor)
        except ApiException as exc:
            refusal = kubernetes_logs.unavailable(exc, target)
            if refusal is None:
                raise
            raise refusal from exc

    def follow_log(self, target: LogTarget, *, tail: int | None = None) -> Iterator[LogLine]:
        """LogSource.follow_log: one streamed `follow=true` request, reopened after a long
        silence (kubernetes_logs.follow)."""

        def open_stream(**query: Any) -> Any:
            return self.core.read_namespaced_pod_log(
                target.pod,
                target.namespace,
                _preload_content=False,
                _request_timeout=(
                    self.config.request_timeout_s,
                    kubernetes_logs.FOLLOW_READ_TIMEOUT_S,
                ),
                **query,
            )

        return kubernetes_logs.follow(open_stream, target, tail=tail)

    # -- watches ----------------------------------------------------------------------------

    def pod_watcher(
        self,
        on_sync: Callable[[list[PodStatus]], None],
        on_event: Callable[[str, PodStatus], None],
        timeout_s: int = 300,
    ) -> ListWatcher[PodStatus]:
        """A list/watch loop over Gantry's pods; run it with `.run(stop_event)`."""
        return ListWatcher(
            list_all=self._list_pod_items,
            open_stream=lambda rv, t: self._open_stream(
                self.core.list_pod_for_all_namespaces, rv, t, **self._pod_selectors()
            ),
            parse=pod_status,
            on_sync=on_sync,
            on_event=on_event,
            timeout_s=timeout_s,
            sleep=self._sleep,
            rand=self._rand,
        )

    def watch_pods(self, stop: threading.Event, timeout_s: int = 300) -> threading.Event:
        """Wake-ups for the daemon: a thread runs the list/watch loop over Gantry's pods
        until `stop` is set (or `close_watches`) and sets the returned event whenever they
        change (created, bound, started, ended, deleted), so that the daemon looks at once
        instead of at its polling interval. The watch fills the informer's cache, from
        which `list_pods` answers once it has seen this process's writes (else it lists):
        a lost watch costs a list, never correctness."""
        changed = threading.Event()
        informer = self.informer = PodInformer(self.config.informer_wait_s)

        def synced(pods: list[PodStatus]) -> None:
            informer.synced(pods, watcher.resource_version or "")
            changed.set()

        def event(kind: str, pod: PodStatus) -> None:
            informer.changed(kind, pod, watcher.resource_version)
            changed.set()

        watcher = self.pod_watcher(synced, event, timeout_s)

        def back_off(seconds: float) -> None:  # ends early on stop
            stop.wait(seconds)

        watcher.sleep = back_off
        self._start(watcher, stop, "gantry-pod-watch")
        self._watch_nodes(stop, back_off)
        return changed

    def _watch_nodes(self, stop: threading.Event, back_off: Callable[[float], None]) -> None:
        """The node watch, beside the pod watch: its cache answers list_nodes while it is
        live (`NodeInformer`). Node changes do not wake the daemon: its inventory sync reads
        them at its own pace, as it listed them before."""
        informer = self.node_informer = NodeInformer(self.config.informer_wait_s)

        def synced(nodes: list[NodeInfo]) -> None:
            informer.synced(nodes, watcher.resource_version or "")

        def event(kind: str, node: NodeInfo) -> None:
            informer.changed(kind, node, watcher.resource_version)

        watcher = self.node_watcher(synced, event, self.config.node_watch_s)
        watcher.on_lapse, watcher.sleep = informer.lapsed, back_off
        self._start(watcher, stop, "gantry-node-watch")

    def _start(self, watcher: ListWatcher[Any], stop: threading.Event, name: str) -> None:
        """The watch's loop in a thread of its own until `stop` (or `close_watches`)."""
        self._watchers.append(watcher)
        threading.Thread(target=watcher.run, args=(stop,), name=name, daemon=True).start()

    def close_watches(self) -> None:
        """Break the open watch streams (after setting the `stop` given to `watch_pods`)."""
        for watcher in self._watchers:
            watcher.close()
        self._watchers.clear()
        if self.informer is not None:
            self.informer.lost()
            self.informer = None
        if self.node_informer is not None:
            self.node_informer.lapsed()
            self.node_informer = None

    def node_watcher(
        self,
        on_sync: Callable[[list[NodeInfo]], None],
        on_event: Callable[[str, NodeInfo], None],
        timeout_s: int = 300,
    ) -> ListWatcher[NodeInfo]:
        """A list/watch loop over nodes; DELETED events carry the node's last state."""
        return ListWatcher(
            list_all=lambda: self._pages("list nodes", self.core.list_node),
            open_stream=lambda rv, t: self._open_stream(self.core.list_node, rv, t),
            parse=lambda raw: self._remember(node_info(raw, self.config)),
            on_sync=on_sync,
            on_event=on_event,
            timeout_s=timeout_s,
            sleep=self._sleep,
            rand=self._rand,
        )

    def _open_stream(
        self, fn: Callable[..., Any], resource_version: str, timeout_s: int, **kwargs: Any
    ) -> Any:
        """Open a watch; the read timeout outlasts the server's so a silent hang breaks."""
        return fn(
            watch=True,
            resource_version=resource_version,
            timeout_seconds=timeout_s,
            allow_watch_bookmarks=True,
            _preload_content=False,
            _request_timeout=(self.config.request_timeout_s, timeout_s + 30),
            **kwargs,
        )


def from_environment() -> KubernetesBackend:
    """The backend `run_scheduler --backend kubernetes` uses: in-cluster credentials or
    KUBECONFIG, settings from GANTRY_K8S_* (docs/kubernetes.md)."""
    return KubernetesBackend()
