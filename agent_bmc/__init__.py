"""BMC telemetry agent (IPMI through pyghmi; hwmon where there is no BMC). Arrives with its issue."""
