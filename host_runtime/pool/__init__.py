"""The engine pool: a supervisor of engine processes, one per loaded model (pool.py), its policy of what stays
loaded (residency.py, pure), its control socket's typed protocol and client (protocol.py), its metrics
(metrics.py) and the engine child process itself (engine_child.py)."""
