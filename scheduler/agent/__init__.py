"""The node agent: reads NVML on a GPU node and reports device health to the daemon.

`nvml.read_node` returns plain dataclasses (tests pass a fake `pynvml`); `report` turns them
into the JSON the `/api/v1/nodes/report/` endpoint takes and posts it.
"""
