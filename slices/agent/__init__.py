"""The node agent (standard library + pynvml only); see ``nvml_agent``."""
