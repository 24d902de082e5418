"""Workloads created in Kubernetes (issue 37): what the admission webhook holds, how it holds
them, and how it is served and registered (docs/kubernetes-native.md, "Admission").

`kinds` and `mutate` are pure (no Django, no client): the webhook decides from the
AdmissionReview alone. `server` serves `mutate` over TLS; `registration` renders the
MutatingWebhookConfiguration that platform/k8s/24-webhook.yaml ships.
"""
