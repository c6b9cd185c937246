"""A model's projector (libmtmd's clip GGUF, `--mmproj`): what it holds once loaded, for the planner and `plan`.

Weights: its tensors' bytes. The encoder's compute: libmtmd sizes its compute buffer for the largest input, one
image at the projector's own size (a sound's 30 s window for an audio encoder) run through one block at a time; the
estimate is that block's activations (positions x width x 4 bytes x 12: the residual, the norms, q/k/v, the
attention's output and the 4x-wide feed-forward) plus its attention scores (positions^2 x heads x 4 bytes, the
graph's largest tensor without flash attention). For gemma3's SigLIP (896 px in 14 px patches: 4096 positions,
1152 wide, 16 heads) that is 1.3 GB, the same order as the CPU compute buffer llama.cpp's mtmd tools log for it.
libmtmd runs the projector on the first GPU where the text model has layers there, else on the CPU
(engine/projector.py sets use_gpu so); its bytes are counted on that device."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from host_runtime.placement import gguf_c

AUDIO_WINDOW_POSITIONS = 1500  # a Whisper encoder's 30 s window, after its convolutions
ACTIVATION_COPIES = 12


@dataclass(frozen=True)
class ProjectorFacts:
    weights_bytes: int
    takes: str       # vision, audio, or vision,audio
    positions: int   # the encoder's positions for its largest input
    width: int
    heads: int

    @property
    def compute_bytes(self) -> int:
        return self.positions * self.width * 4 * ACTIVATION_COPIES + self.positions ** 2 * self.heads * 4

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.compute_bytes

    def to_json(self) -> dict:
        return {"weights_bytes": self.weights_bytes, "compute_bytes": self.compute_bytes, "takes": self.takes,
                "positions": self.positions}


def read_projector(path: str | Path) -> ProjectorFacts:
    """The projector's facts from its GGUF's header (ValueError for a file ggml cannot read as a GGUF)."""
    with gguf_c.GGUFTable(path) as table:
        architecture = table.value("general.architecture")
        if architecture != "clip":
            raise ValueError(f"a {architecture} model, not a projector (a clip GGUF, often named mmproj-*.gguf)")
        takes = [kind for kind in ("vision", "audio") if table.value(f"clip.has_{kind}_encoder")] or ["vision"]
        encoder = takes[0]

        def number(key: str, default: int = 0) -> int:
            value = table.value(f"clip.{encoder}.{key}")
            return int(value) if isinstance(value, (int, float)) else default

        if encoder == "vision":
            patch = max(1, number("patch_size", 14))
            positions = (number("image_size", 224) // patch) ** 2
        else:
            positions = AUDIO_WINDOW_POSITIONS
        weights = sum(size for _, _, _, size in table.tensors())
        return ProjectorFacts(weights, ",".join(takes), positions, number("embedding_length"),
                              max(1, number("attention.head_count", 1)))


def projector_bytes(path: str | None) -> int:
    """What a model's projector adds to its engine's memory (0 for none; its file's size where unreadable: the
    engine's load then names the fault)."""
    if not path:
        return 0
    try:
        return read_projector(path).total_bytes
    except (ValueError, OSError):
        try:
            return Path(path).stat().st_size
        except OSError:
            return 0


def with_projector_room(config, projector: ProjectorFacts | None):
    """The engine's context settings (engine.model.ContextConfig) with room kept on the GPUs for the projector:
    libmtmd puts it on the first GPU when the model has layers there, so the layers leave its bytes free (the
    margin is each GPU's: on several cards the others keep it too, which errs on the side of room)."""
    if projector is None:
        return config
    from dataclasses import replace

    return replace(config, gpu_margin_bytes=config.gpu_margin_bytes + projector.total_bytes)


def projector_device(placement, projector: ProjectorFacts) -> str | None:
    """Where libmtmd runs the projector under this plan, where it fits: the first GPU holding layers (room kept by
    with_projector_room), else the CPU when host RAM has room beside the plan; None when it does not."""
    gpus = [s for s in placement.gpu_shares if s.last_layer > s.first_layer]
    if gpus:
        return gpus[0].device
    cpu = placement.cpu_share
    return cpu.device if cpu.used_bytes + projector.total_bytes <= cpu.capacity_bytes else None
