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
DEFAULT_KV_BUDGET_MIB = 1024  # the KV cache's memory where neither the owner nor the model says
# The engine's other defaults, which serve's flags show and the engine's settings classes take (engine/options.py,
# engine/speculation.py, engine/model.py)
PREFIX_CACHE_RAM_MIB = 1024   # host RAM for cached prompt prefixes moved out of the context
PREFIX_CACHE_DISK_MIB = 4096  # disk for those moved out of RAM
# The most tokens one sequence drafts in a step: measured on a code edit at c=1 (bench/serving.py), 1.39x without
# speculation; 6 gave 1.30x. At most DRAFT_CEILING: a step holds 16 decode tokens, the pending one and 15 drafted.
DRAFT_MAX = 12
DRAFT_CEILING = 15
GPU_MARGIN_MIB = 512          # each GPU keeps the larger of this and 5% of the card free
