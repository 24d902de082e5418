"""The demo organisation and the load generator that keeps its teams submitting (`make run`)."""
