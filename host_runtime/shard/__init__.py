"""One model across several boxes: llama.cpp's RPC backend, behind the fleet's key.

A member box lends its devices (`everycycle shard host`): llama.cpp's RPC server on loopback, reachable from the
LAN only through stunnel's TLS, keyed by a secret derived from the fleet key (wire_key.py), so a peer without
the fleet key reaches nothing. The box holding the model (`serve --shard-host ADDR:PORT`) reaches each member
through its own stunnel client, checks the member speaks this llama.cpp's RPC protocol (probe.py), and registers
it with ggml (rpc_backend.py): the member's devices are then devices like the holder's GPUs, which the planner
places layers on and llama.cpp's dry run proves.
"""
