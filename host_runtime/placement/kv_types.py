"""The KV cache's value types, by llama-server's names (--cache-type-k / --cache-type-v): their ggml type and
size, for the planner's arithmetic and llama.cpp's context parameters (pure)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class KVType:
    name: str
    ggml_type: int     # ggml.h's enum ggml_type
    block: int         # values per block
    block_bytes: int   # bytes per block

    @property
    def quantized(self) -> bool:
        return self.block > 1

    def row_bytes(self, width: int) -> int:
        """Bytes of `width` values (a quantized row is whole blocks: llama.cpp refuses a width they do not divide)."""
        return -(-width // self.block) * self.block_bytes


# llama-server's allowed values (common/arg.cpp kv_cache_types), with ggml's sizes (ggml.c type_traits).
KV_TYPES = {t.name: t for t in (
    KVType("f32", 0, 1, 4), KVType("f16", 1, 1, 2), KVType("bf16", 30, 1, 2), KVType("q8_0", 8, 32, 34),
    KVType("q4_0", 2, 32, 18), KVType("q4_1", 3, 32, 20), KVType("iq4_nl", 20, 32, 18), KVType("q5_0", 6, 32, 22),
    KVType("q5_1", 7, 32, 24))}
DEFAULT_KV = ("f16", "f16")


def kv_type(name: str) -> KVType:
    try:
        return KV_TYPES[name]
    except KeyError:
        raise ValueError(f"not a KV cache type: {name!r} (one of {', '.join(KV_TYPES)})") from None


def needs_flash_attention(types: tuple[str, str]) -> bool:
    """llama.cpp stores V transposed without flash attention, which a quantized V cannot be; and a quantized K
    is read by flash attention's one per-row kernel on the CPU in every shape (no split over the KV cells, no
    tiles: both need F16 or F32 K and V), which keeps a request's output the same alone or batched."""
    return kv_type(types[0]).quantized or kv_type(types[1]).quantized


def per_row_attention(types: tuple[str, str]) -> bool:
    """Whether llama.cpp's CPU flash attention computes each query row alone, over every KV cell in one pass, in
    every shape (its split over the cells for one query row and its tiles for many both need K and V of the
    same F16 or F32 type): a row's result is then the same whatever else the call holds."""
    return types[0] not in ("f16", "f32") or types[0] != types[1]


@dataclass(frozen=True)
class AttentionLayout:
    """How a generation context computes attention and stores its KV cache, in which batching mode, and why: said
    in the engine's log and in /metrics (everycycle_batching_info), and part of the prefix cache's fingerprint."""
    mode: str    # the batching mode: "invariant" or "mixed"
    flash: str   # "on", "off", or "auto" (llama.cpp decides)
    type_k: str  # the types the cache is stored in (which may differ from the ones asked for: see below)
    type_v: str
    reason: str

    @property
    def per_row(self) -> bool:
        """Each query row computed alone, whatever the call's shape: a row's result is the same alone, batched
        with other sequences, or as one of a draft's rows (speculation verifies them exactly)."""
        return self.flash == "on" and per_row_attention((self.type_k, self.type_v))


# The longest context per sequence at which the invariant mode on the CPU takes per-row flash attention for its
# speed (with two or more sequences): see attention_layout's measurements.
PER_ROW_MAX_CTX = 2048


def attention_layout(types: tuple[str, str], *, batch_invariant: bool, cpu_only: bool, speculation: bool = False,
                     n_ctx_per_seq: int = 0, n_parallel: int = 1, remote: bool = False,
                     f16_wide_vectors: bool = False) -> AttentionLayout:
    """The attention the engine runs with these KV types (K, V) in this batching mode, and why.

    Not invariant: llama.cpp's own choice (flash attention where it can: its split and tiled kernels), as
    llama-server runs. Invariant with layers on a GPU: plain attention (GPU kernels are not measured for this),
    flash attention only where a quantized type needs it.

    Invariant with every layer on the CPU, the attention must compute a row the same whatever else the call
    holds. Plain attention does alone or batched, one row at a time; not a draft's rows (its matrix products go
    to tinyBLAS from two rows and to vec_dot for one: verified rows 0.47-1.1 apart in their logits). llama.cpp's
    flash attention computes each query row alone, in every shape, unless K and V are the same F16 or F32 type,
    when the call's shape picks other paths: for one query token of a call's only sequence from 512 KV cells, a
    split over the cells whose partial sums add up in another order (logits 0.53 apart from the same position
    batched; a greedy answer changed), and tiles from 64 query rows. So where flash attention is taken for the
    F16 pair K is stored as BF16 (the same two bytes a value: the plan's memory is unchanged), for F32 V is.

    Which one, measured on 2 cores (llama-batched-bench, a stream per sequence, SmolLM2-135M; tokens/s):
    per-row flash (K BF16) against plain attention against llama-server's own (flash, F16 K and V):
      decode, 16 sequences at 100 cells: 328-337 / 273-276 / 320-329; at 400: 269-277 / 237-249 / 264;
      decode, 8 and 16 sequences at 1,024 cells: 183 and 206 / 149 and 171;
      decode, one sequence at 2,048 and 8,192 cells: 79 and 32 / 80 and 37 / 93 and 36;
      prompt of 100 tokens: 470 / 420 / 460; 1,024: 360 / 395; 2,048: 262 / 354 / 382; 8,192: 116 / 208 / 214.
    Per-row flash pays when several sequences decode together over short contexts and costs long prompts
    dearly; so it runs where that is the box's shape (two or more sequences of at most PER_ROW_MAX_CTX tokens),
    and wherever speculation verifies drafts (which needs a draft's rows exact); plain attention elsewhere.
    (V as BF16 instead of K: 306-309 at 16 sequences, 100 cells: its rows convert a cell at a time.)

    Except where ggml's F16 arithmetic is AVX512-FP16's (`f16_wide_vectors`: llama.cpp built natively on a CPU
    with avx512_fp16, Sapphire Rapids and newer): its F16 vector loops then go 128 values a step and leave a
    shorter row (SmolLM2's heads are 64 wide) to a scalar loop, and per-row flash attention adds each V cell
    into an F16 sum that way, a conversion there and back per value (and dots each K cell with the query so). There
    K and V are both stored as BF16 (V summed in F32). Measured on a 2-core Xeon with AVX512-FP16 and AMX
    (SmolLM2-135M): in-process, 16 streams of 1,024 cells, alternated, medians of 9, an 84-token prompt after 25
    cached tokens took 311 ms with K and V BF16, 303 with V alone, 354 with K alone (llama.cpp's own flash
    attention, F16 K and V: 298); 16 sequences' decode call 91.6, 92.8 and 101.5 ms (102). At 2,048 tokens of one
    sequence (bench/kv_cache.py): the prompt 15.9 s, 19.3 and 32.8 (plain attention 12.6), a decoded token 23.2,
    26.5 and 41.7 ms (23.2); perplexity 11.917, 11.906 and 11.904 against F16's 11.916, top-1 agreement 96.4%,
    97.0% and 96.2%.

    Invariant with layers on another box's devices (`remote`, llama.cpp's RPC backend): flash attention, as for
    a quantized cache: plain attention stores V transposed, and reading a sequence's KV (the prefix cache's every
    save) then asks for each of its rows apart, one network round trip each: 5,760 a save for SmolLM2-135M's 20
    remote layers, TTFT 1.5 s against 0.6 s without the prefix cache (2 cores, loopback members)."""
    k, v = types
    quantized = needs_flash_attention(types)
    if not batch_invariant:
        return AttentionLayout("mixed", "on" if quantized else "auto", k, v,
                               "mixed batches" + (" (layers on other boxes)" if remote else "")
                               + ": llama.cpp's choice of attention kernels, as llama-server's")
    if remote:
        return AttentionLayout("invariant", "on", k, v, "batch-invariant with layers on other boxes: flash attention "
                                                        "(V kept untransposed: the prefix cache reads it a layer "
                                                        "at a time over the network)")
    if not cpu_only:
        flash, why = ("on", "flash attention for the quantized cache") if quantized else ("off", "plain attention")
        return AttentionLayout("invariant", flash, k, v, f"batch-invariant with GPU layers: {why}")
    if per_row_attention(types):
        why = "a quantized cache" if quantized else f"K {k} and V {v}"
        return AttentionLayout("invariant", "on", k, v,
                               f"batch-invariant on the CPU with {why}: flash attention one query row at a time")
    short = n_parallel >= 2 and n_ctx_per_seq <= PER_ROW_MAX_CTX
    if not (speculation or short):
        return AttentionLayout("invariant", "off", k, v,
                               "batch-invariant on the CPU: plain attention (per-row flash attention is slower on "
                               f"prompts over {PER_ROW_MAX_CTX} tokens or one sequence)")
    if k == "f16":
        k, v = ("bf16", "bf16") if f16_wide_vectors else ("bf16", v)
    else:
        v = "bf16"
    why = ("speculation: a draft's rows verified exactly" if speculation else
           f"{n_parallel} sequences of {n_ctx_per_seq} tokens: faster than plain attention")
    return AttentionLayout("invariant", "on", k, v, "batch-invariant on the CPU: flash attention one query row at a "
                                                    f"time, K stored as {k} and V as {v} so that it stays per row "
                                                    f"({why}"
                                                    + ("; V too: this CPU's F16 vectors are AVX512-FP16's, 128 "
                                                       "values a step)" if f16_wide_vectors and k == v else ")"))
