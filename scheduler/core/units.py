"""The engine's units and node labels, for the engine and for readers outside it (metrics,
node pages) that speak in the same units without building the engine's types."""

MILLI_PER_GPU = 1000  # one whole device, in milli-GPU
LABEL_NVLINK_DOMAIN = "gantry.io/nvlink-domain"
LABEL_RACK = "gantry.io/rack"
