"""One GPU layer: the cards as llama.cpp, NVML and amdgpu see them."""
