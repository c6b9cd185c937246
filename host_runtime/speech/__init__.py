"""A speech-to-text model's engine process: a Whisper model run by whisper.cpp (pywhispercpp), never beside
llama.cpp in one process (each carries its own ggml)."""
