"""The row counts at which llama.cpp's CPU kernels change, by weight type (placement/matmul_rows.py), alone: what
the invariant mode keeps its calls within. The engine keeps them against llama.cpp itself in
tests/test_batch_invariance.py."""

from __future__ import annotations

from host_runtime.placement.matmul_rows import (BF16, F16, F32, IQ4_NL, NO_BOUNDS, Q2_K, Q4_0, Q4_1, Q4_K, Q6_K, Q8_0,
                                                matrix_types, row_bounds)
from host_runtime.placement.model_table import TensorInfo


def bounds(*types, invariant=True, cpu_only=True, repacked=True):
    return row_bounds(set(types), invariant=invariant, cpu_only=cpu_only, repacked=repacked)


def test_types_computed_alike_at_any_row_count_keep_no_bound():
    assert bounds(Q4_1, Q8_0) == NO_BOUNDS  # the default model's
    assert bounds(Q4_0, IQ4_NL).decode_rows() is None
    # what lets the invariant mode put a step in one call (with per-row attention: engine/model.py)
    assert bounds(Q4_1, Q8_0).any_count and bounds(Q4_0, IQ4_NL).any_count
    assert not any(b.any_count for b in (bounds(Q4_K, Q6_K), bounds(Q6_K, repacked=False), bounds(F16),
                                         bounds(Q4_1, cpu_only=False)))


def test_k_quants_keep_decode_calls_below_the_tiled_kernels_and_the_repacked_gemm():
    unpacked = bounds(Q4_K, Q6_K, Q8_0, repacked=False)
    assert unpacked.bounds == (8,) and unpacked.decode_rows() == 7
    assert unpacked.most_rows(3) == 7 and unpacked.most_rows(8) is None  # a chunk of 8 is tiled alone already
    q4_k_m = bounds(Q4_K, Q6_K, Q8_0)  # repacked: a call's first 4 x (n // 4) rows go to the gemm
    assert q4_k_m.decode_rows() == 3 and "decode calls of at most 3 rows" in q4_k_m.reason
    assert q4_k_m.most_rows(128) is None    # whole groups: every row in the gemm, alone or joined
    assert q4_k_m.most_rows(130) == 130     # a chunk cut after a message's end: alone
    assert q4_k_m.most_rows(4) == 7         # the tiled Q6_K's bound still holds: one 4-row chunk a call
    assert bounds(Q6_K).decode_rows() == 7 and bounds(Q2_K).decode_rows() == 3


def test_float_matrices_keep_one_sequence_a_call():
    for t in (F32, F16, BF16):
        rule = bounds(Q4_K, t, repacked=False)
        assert rule.decode_rows() == 1 and rule.most_rows(4) == 4 and rule.most_rows(128) == 128
        assert "one sequence a call, no speculative drafts" in rule.reason
    assert bounds(99).decode_rows() == 1 and "not measured" in bounds(99).reason


def test_mixed_batches_keep_none_and_gpu_layers_say_the_promise_does_not_hold():
    assert bounds(F16, Q4_K, invariant=False) == NO_BOUNDS
    gpu = bounds(F16, Q4_K, cpu_only=False)
    assert gpu.decode_rows() is None and not gpu.held and "lavapipe" in gpu.reason


class _Table:
    def __init__(self, layers, outputs, inputs, tied):
        self.layer_tensors, self.output_tensors, self.input_tensors, self.tied_output = layers, outputs, inputs, tied


def test_the_matrices_are_the_layers_and_output_and_a_tied_embedding():
    norm = TensorInfo("blk.0.attn_norm.weight", F32, (256,), 1024)
    q = TensorInfo("blk.0.attn_q.weight", Q4_K, (256, 256), 36864)
    embd = TensorInfo("token_embd.weight", Q8_0, (256, 1000), 272000)
    head = TensorInfo("output.weight", Q6_K, (256, 1000), 210000)
    assert matrix_types(_Table(((norm, q),), (head,), (embd,), tied=False)) == {Q4_K, Q6_K}
    assert matrix_types(_Table(((norm, q),), (), (embd,), tied=True)) == {Q4_K, Q8_0}


def test_a_q4_k_m_llama_keeps_three_rows_a_decode_call_and_its_metrics_say_why():
    from host_runtime.placement.model_table import synthetic_table
    from host_runtime.placement.planner import GIB, Host, PlanRequest, plan
    from host_runtime.placement.render import prometheus_lines

    q4_k_m = {"attn_q": Q4_K, "attn_k": Q4_K, "attn_v": Q6_K, "attn_output": Q4_K, "ffn_gate": Q4_K, "ffn_up": Q4_K,
              "ffn_down": Q6_K, "token_embd": Q4_K, "output": Q6_K, "norm": F32}
    table = synthetic_table(name="Llama-3.1-8B-Instruct-Q4_K_M", n_layer=32, n_embd=4096, n_ff=14336, n_head=32,
                            n_head_kv=8, n_vocab=128256, n_ctx_train=131072, types=q4_k_m)
    assert matrix_types(table) == {Q4_K, Q6_K}  # not the F32 norms, not the embedding (an untied head)
    rule = row_bounds(matrix_types(table), invariant=True, cpu_only=True, repacked=True)
    placement = plan(table, [], Host(available_bytes=30 * GIB, total_bytes=32 * GIB), PlanRequest(n_ctx_per_seq=4096))
    line = next(x for x in prometheus_lines(placement, {}, None, rows=rule)
                if x.startswith("everycycle_batching_decode_rows{"))
    assert line.endswith(" 3.0") and "Q4_K repacked compute rows in groups of 4 otherwise" in line
    assert not any(x.startswith("everycycle_batching_decode_rows{")
                   for x in prometheus_lines(placement, {}, None, rows=NO_BOUNDS))
