"""The box's catalog, as shipped (read by models/catalog.py). TOML in a module, so that it travels in the wheel
with the code that reads it.

The box's catalog: models that run well on cheap boxes, pulled by a short name (`everycycle models pull qwen3:8b`,
Ollama's /api/pull, the wizard). Reviewed by hand; each entry says why it is here. An entry names a repository on
the Hugging Face Hub and its quantizations, best default first (the file is found in the repository's listing,
and its sha256 is the listing's LFS object id, checked after the download: the listing is where the hashes are
kept current, and this file pins what to pull, not bytes that the repository's owner may requantize), or one file
(`file`, for a repository whose names carry no quantization). The owner adds their own in
$EVERYCYCLE_STATE_DIR/catalog.toml (or EVERYCYCLE_CATALOG), same shape; theirs wins on a name they share.
Fields: name, tag, repo, quants or file, size_gb (the default file's size, about: the wizard orders by it
offline; the pull's verdict reads the real one), context (trained), can (tools, reasoning, vision, embeddings, rerank,
fim, speech), license, why.
"""

SHIPPED = """\
[[model]]
name = "qwen3"
tag = "8b"
repo = "Qwen/Qwen3-8B-GGUF"
quants = ["Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0"]
size_gb = 5.0
context = 32768
can = ["tools", "reasoning"]
license = "Apache-2.0"
why = "the strongest all-rounder that fits an 8 GB card or 16 GB of RAM at Q4_K_M (about 5 GB): tool calls for agents, thinking on request"

[[model]]
name = "qwen3"
tag = "4b"
repo = "Qwen/Qwen3-4B-GGUF"
quants = ["Q4_K_M", "Q8_0"]
size_gb = 2.5
context = 32768
can = ["tools", "reasoning"]
license = "Apache-2.0"
why = "the same family for a plain PC: about 2.5 GB at Q4_K_M, usable speed on a few CPU cores"

[[model]]
name = "gemma3"
tag = "4b"
repo = "ggml-org/gemma-3-4b-it-GGUF"
quants = ["Q4_K_M", "Q8_0"]
size_gb = 3.3
context = 131072
can = ["vision"]
license = "Gemma"
why = "images on a small box: its projector comes along, and libmtmd runs it in the batched engine"

[[model]]
name = "qwen2.5-coder"
tag = "7b"
repo = "bartowski/Qwen2.5-Coder-7B-Instruct-GGUF"
quants = ["Q4_K_M", "Q6_K", "Q8_0"]
size_gb = 4.7
context = 32768
can = ["tools", "fim"]
license = "Apache-2.0"
why = "editor autocomplete (its FIM tokens, /infill) and coding agents from one model; single files, where Qwen's own repository splits them"

[[model]]
name = "llama3.2"
tag = "3b"
repo = "bartowski/Llama-3.2-3B-Instruct-GGUF"
quants = ["Q4_K_M", "Q8_0"]
size_gb = 2.0
context = 131072
can = ["tools"]
license = "Llama 3.2 Community"
why = "small with a long trained context, for summaries of long documents on a CPU box"

[[model]]
name = "gpt-oss"
tag = "20b"
repo = "ggml-org/gpt-oss-20b-GGUF"
quants = ["MXFP4"]
size_gb = 12.1
context = 131072
can = ["tools", "reasoning"]
license = "Apache-2.0"
why = "a mixture of experts (3.6B active of 21B): 12 GB, which the planner splits between a used 3090-class card and RAM (--cpu-moe)"

[[model]]
name = "nomic-embed-text"
tag = "v1.5"
repo = "nomic-ai/nomic-embed-text-v1.5-GGUF"
quants = ["Q8_0", "F16"]
size_gb = 0.14
context = 2048
can = ["embeddings"]
license = "Apache-2.0"
why = "embeddings for retrieval (Open WebUI's documents), 140 MB: runs beside any chat model"

[[model]]
name = "bge-reranker"
tag = "v2-m3"
repo = "gpustack/bge-reranker-v2-m3-GGUF"
quants = ["Q8_0"]
size_gb = 0.6
context = 8192
can = ["rerank"]
license = "MIT"
why = "reranks retrieved passages (/v1/rerank) in many languages, 600 MB"

[[model]]
name = "whisper"
tag = "base"
repo = "ggerganov/whisper.cpp"
file = "ggml-base.bin"
size_gb = 0.15
context = 448
can = ["speech"]
license = "MIT"
why = "speech to text (/v1/audio/transcriptions) at a tenth of real time on 2 cores (bench/speech.py), 148 MB"

[[model]]
name = "whisper"
tag = "small"
repo = "ggerganov/whisper.cpp"
file = "ggml-small.bin"
size_gb = 0.49
context = 448
can = ["speech"]
license = "MIT"
why = "better transcripts than base at a third of real time on 2 cores, 488 MB"
"""
