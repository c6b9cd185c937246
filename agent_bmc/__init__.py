"""BMC telemetry agent: IPMI through pyghmi, or hwmon where there is no BMC.

Self-contained: it shares nothing with host_runtime but the snapshot schema (schema.py).
"""
