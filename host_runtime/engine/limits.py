"""The bounds and defaults of a served model's settings, said once for every place that takes them: serve's flags
and serving.toml (serving/settings.py, whose annotated types box.toml's model shares), a model's own settings in
the store (models/model_settings.py), `plan` and the console's verdict. Plain constants, no imports: the CLI
reads them before it loads anything."""

MIN_CONTEXT = 256         # tokens per sequence: less holds no chat template and a question
MAX_CONTEXT = 1 << 20     # tokens per sequence a setting may ask for
MAX_PARALLEL = 256        # sequences at once a setting may ask for
MIN_KV_BUDGET_MIB = 16    # below this no sequence of any use fits
MAX_MIB = 1 << 24         # a memory setting's ceiling (16 TiB)
SPECULATION = ("off", "ngram")  # a draft model is a file of its own: `serve --speculation draft --draft-model`
# A cap, not a size: a model is served at the context it was trained for (its GGUF's context_length), up to this,
# as agents' 10,000-25,000-token prompts need; the planner lowers the sequences, then the context, where memory is
# short, and says so. --ctx-size (serving.toml's context_length) sets another cap.
DEFAULT_CTX = 32768
