"""The pods an operator makes beside a job's replicas, its companions (a RayJob's CPU head and
submitter, a JobSet's driver, a PyTorchJob's CPU Master, a TrainJob's initializers; issue 37,
docs/kubernetes-native.md): reconcile binds them to replica 0's node (`binding`) and judges
one that fails or never starts (`faults`)."""
