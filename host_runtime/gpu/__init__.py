"""One GPU layer: the cards as llama.cpp, NVML and amdgpu see them, and the llama.cpp library itself (which build
loads, its exported symbols, its log)."""
