"""The job domain: the spec, the state machine and its transitions, submit, approval, the queue,
reads, notifications."""
