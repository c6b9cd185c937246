"""The placement planner: topology + GGUF tensor table -> a placement llama.cpp is told exactly, proven before load."""
