"""How many rows (tokens) a call may hold before llama.cpp's CPU matrix products compute a row differently, by the
model's weight types: the bound the invariant mode keeps so that a sequence's tokens compute the same alone or
batched (engine/step_plan.py splits calls at it). Pure: the types come from the GGUF's tensor table.

llama.cpp's CPU backend picks a matrix product's kernel by the call's row count, and the kernels sum in different
orders. Measured (2-core AMD EPYC with AVX-512, the pinned llama.cpp; one sequence's decode token alone against the
same token beside 1-15 others in one call, a stream per sequence, logits compared bit for bit):
  - F32, F16, BF16 matrices: llamafile's tinyBLAS from 2 rows, vec_dot for one: logits up to 3.5e-4 (F32), 2.4e-3
    (F16), 1.1e-2 (BF16) apart on a random-weight model, 9.6e-3 and 4.4e-2 on SmolLM2-135M in F16 and BF16; and
    a prompt chunk's rows move with the call's shape too (F16: 8e-5 to 3.6e-4 joined with 1-7 others);
  - K-quants and the IQ types of ggml-cpu's tiled kernels: tiled from 8 rows, vec_dot below: up to 0.13 apart
    (a random model at Q4_K_M, Q3_K_M, Q5_K_M, Q6_K, Q2_K);
  - Q4_K and Q2_K repacked for this CPU (the CPU_REPACK buffer): a 4-row gemm from 4 rows: 0.066-0.12 apart;
  - Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, MXFP4 (tinyBLAS or repacked where they are): identical at every count.
So the invariant mode keeps a decode call's rows below the first bound a lone token's call would cross (and
joins prompt chunks only where each keeps its own chunk's kernels): Q4_K or Q2_K repacked, decode calls of at most 3
rows; other K-quants, at most 7; F32/F16/BF16 matrices, one sequence a call. Measured on a 150M-parameter
random llama at Q4_K_M (2 cores, in-process, per call): 16 decoding sequences in calls of 3 rows 51-53 ms, against
25 ms in one call (before the bound) and 49 ms in calls of 7 with the weights not repacked, which would make
one-token calls 4.0-4.9 ms against 3.6-4.4 ms (prompts 1.2x faster: ggml's tiled kernels outrun the repacked gemm
there). The repacked weights stay: a lone user's decoding is the box's first case. Calls on GPUs (their own kernels)
are not covered: measured on Vulkan, they do not keep the promise at any bound worth keeping (GPU_NOT_HELD).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Iterable

# ggml's type ids (ggml.h; gguf.GGMLQuantizationType's numbers, written here because placement imports gguf only
# where it reads a file: 0.12 s and numpy, which the serving API's processes do not load)
F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 = 0, 1, 2, 3, 6, 7, 8
Q2_K, Q3_K, Q4_K, Q5_K, Q6_K = 10, 11, 12, 13, 14
IQ2_XXS, IQ2_XS, IQ3_XXS, IQ1_S, IQ4_NL, IQ3_S, IQ2_S, IQ4_XS, IQ1_M, BF16 = 16, 17, 18, 19, 20, 21, 22, 23, 29, 30
MXFP4 = 39

TINYBLAS_DIFFERS = frozenset({F32, F16, BF16})  # vec_dot for one row, tinyBLAS from two, its tiles by the call's shape
TILED = frozenset({Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M})
TILED_FROM_ROWS = 8  # ggml-cpu/tiled: ggml_tiled_min_batch
REPACK_DIFFERS = frozenset({Q4_K, Q2_K})
REPACK_GROUP = 4  # their repacked gemm's rows (ggml-cpu/repack.cpp)
SAME_AT_EVERY_COUNT = frozenset({Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, MXFP4})
# Any other type (ternary, NVFP4, Q1_0...) is not measured: kept as the F32 ones, one decoding sequence a call.


@dataclass(frozen=True)
class RowBounds:
    """The row counts from which a call's rows compute differently (ascending; empty: none), the row groups of a
    repacked gemm (0: none; a call of n rows computes its first 4 x (n // 4) rows in it, the rest apart), and
    whether every slice must have its call alone (F32/F16/BF16 matrices: tinyBLAS's results move with the
    call's shape)."""
    bounds: tuple[int, ...] = ()
    repack_group: int = 0
    alone: bool = False
    reason: str = ""
    held: bool = True  # False: the invariant mode cannot keep its promise here (layers on a GPU), as `reason` says

    def most_rows(self, slice_tokens: int) -> int | None:
        """The most rows a call of slices `slice_tokens` long may hold so that each computes as it would alone
        (None: no bound). Slices of a repacked gemm's group multiple keep their rows in it joined; others join
        only below one group."""
        if self.alone:
            return slice_tokens
        limits = [b - 1 for b in self.bounds if b > slice_tokens]
        if self.repack_group and slice_tokens % self.repack_group:
            limits.append(max(slice_tokens, self.repack_group - 1))
        return min(limits) if limits else None

    @property
    def any_count(self) -> bool:
        """Every row computes alike in a call of any number of rows: a row's result does not depend on the call."""
        return not (self.bounds or self.repack_group or self.alone) and self.held

    def decode_rows(self) -> int | None:
        """The most rows a decode call may hold: a decoding sequence's token (and a draft's, verified with it)
        must compute as a lone token does in its own call."""
        return self.most_rows(1)

    def max_draft(self) -> int | None:
        """The longest draft a decode call may verify beside its sequence's token (None: any; 0: none)."""
        rows = self.decode_rows()
        return None if rows is None else rows - 1


NO_BOUNDS = RowBounds()  # mixed batches, and models whose kernels compute a row alike at any count
# With layers on a GPU: measured on Mesa's lavapipe (Vulkan; bench/row_probe.py --gpu-layers 999, 2026-12-07), a decode
# token beside others came out 4e-5 apart from 2 rows (Q4_K_M) or 4 (F16) or 6 (Q4_0), and 1.4-4.2 apart from 9
# (another matrix kernel); CUDA is not measured yet (the device check runs the probe). No bound is kept there.
GPU_NOT_HELD = ("with layers on a GPU its kernels compute a row otherwise beside others (Vulkan on lavapipe: logits "
                "4e-5 apart from 2 rows, 1.4-4.2 from 9), so a request's temperature-0 output may differ alone and "
                "batched")


def matrix_types(table) -> set[int]:
    """The types of the weights the model multiplies by (placement/model_table.ModelTable): every tensor of two or
    more dimensions in its layers and output layer, the token embedding too where the output reuses it."""
    tensors = [t for layer in table.layer_tensors for t in layer] + list(table.output_tensors)
    if table.tied_output:
        tensors += [t for t in table.input_tensors if t.name == "token_embd.weight"]
    return {t.ggml_type for t in tensors if sum(1 for n in t.shape if n > 1) >= 2}


def row_bounds(types: Iterable[int], *, invariant: bool, cpu_only: bool, repacked: bool) -> RowBounds:
    """What the invariant mode keeps for a model with these matrix types (see the module's text); repacked:
    llama.cpp repacked weights for this CPU (its CPU_REPACK buffer)."""
    types = set(types)
    if not invariant:
        return NO_BOUNDS
    if not cpu_only:
        return RowBounds(held=False, reason=GPU_NOT_HELD)
    bounds, why = [], []
    unmeasured = types - TINYBLAS_DIFFERS - TILED - SAME_AT_EVERY_COUNT
    if found := types & TINYBLAS_DIFFERS:
        why.append(f"{_names(found)} matrices compute a row otherwise in calls of other shapes")
    elif unmeasured:
        why.append(f"type {_names(unmeasured)} matrices not measured for row counts")
    alone = bool(types & TINYBLAS_DIFFERS or unmeasured)
    if found := types & TILED:
        bounds.append(TILED_FROM_ROWS)
        why.append(f"{_names(found)} matrices compute {TILED_FROM_ROWS} rows or more otherwise than fewer")
    group = REPACK_GROUP if repacked and types & REPACK_DIFFERS else 0
    if group:
        why.append(f"{_names(types & REPACK_DIFFERS)} repacked compute rows in groups of {group} otherwise")
    rule = RowBounds(tuple(sorted(bounds)), group, alone)
    if not why:
        return rule
    say = ("one sequence a call, no speculative drafts" if alone else
           f"decode calls of at most {rule.decode_rows()} rows (sequences, and drafts verified beside them)")
    return replace(rule, reason=f"{'; '.join(why)}: {say}")


def _names(types: set[int]) -> str:
    import gguf

    def name(t: int) -> str:
        try:
            return gguf.GGMLQuantizationType(t).name
        except ValueError:  # a type newer than this gguf
            return str(t)

    return ", ".join(sorted(name(t) for t in types))
