"""Which attention each batching mode, placement and context runs with, and that it keeps the invariant mode's
promise by construction (pure: placement/kv_types.attention_layout)."""

from __future__ import annotations

import pytest

from host_runtime.placement.kv_types import (KV_TYPES, PER_ROW_MAX_CTX, attention_layout, kv_type,
                                             per_row_attention)
from host_runtime.placement.llama_params import native_build


def layout(types=("f16", "f16"), **given):
    settings = {"batch_invariant": True, "cpu_only": True, "n_ctx_per_seq": 1024, "n_parallel": 16} | given
    return attention_layout(types, **settings)


def test_several_short_sequences_on_the_cpu_get_per_row_flash_attention_with_k_as_bf16():
    a = layout()
    assert (a.flash, a.type_k, a.type_v, a.per_row) == ("on", "bf16", "f16", True)
    assert "16 sequences of 1024 tokens" in a.reason
    # the same bytes a value: the planner's figures hold for what is allocated
    assert kv_type(a.type_k).row_bytes(64) == kv_type("f16").row_bytes(64)


def test_where_f16_vectors_are_avx512_fp16s_k_and_v_are_both_stored_as_bf16():
    """ggml's AVX512-FP16 loops go 128 values a step and leave a 64-wide head's F16 dot and sum to a scalar loop:
    per-row attention there stores K and V as BF16 (V summed in F32)."""
    a = layout(f16_wide_vectors=True)
    assert (a.flash, a.type_k, a.type_v, a.per_row) == ("on", "bf16", "bf16", True)
    assert per_row_attention((a.type_k, a.type_v)) and "AVX512-FP16" in a.reason
    assert kv_type(a.type_v).row_bytes(64) == kv_type("f16").row_bytes(64)  # the plan's memory holds
    assert "AVX512-FP16" not in layout().reason
    assert layout(n_parallel=1, f16_wide_vectors=True).type_v == "f16"  # plain attention: nothing is per row
    assert layout(("q8_0", "q8_0"), f16_wide_vectors=True).type_v == "q8_0"  # asked-for types that are per row
    assert layout(f16_wide_vectors=True, speculation=True, n_parallel=1).type_v == "bf16"


def test_whether_llama_cpp_was_built_for_this_cpu_is_read_from_the_images_record():
    assert native_build(None)  # no record: make run's build, for the machine it runs on
    assert native_build("-DGGML_RPC=ON -DGGML_NATIVE=ON")
    assert not native_build("-DGGML_NATIVE=OFF -DGGML_AVX2=ON") and not native_build("-DGGML_NATIVE=off")


@pytest.mark.parametrize("given", [{"n_ctx_per_seq": PER_ROW_MAX_CTX + 1}, {"n_parallel": 1}])
def test_long_contexts_or_one_sequence_get_plain_attention_and_say_why(given):
    a = layout(**given)
    assert (a.flash, a.type_k, a.type_v, a.per_row) == ("off", "f16", "f16", False)
    assert "plain attention" in a.reason and str(PER_ROW_MAX_CTX) in a.reason


def test_speculation_gets_exact_rows_whatever_the_context():
    a = layout(n_ctx_per_seq=32768, n_parallel=1, speculation=True)
    assert a.per_row and a.type_k == "bf16" and "draft" in a.reason
    assert layout(("f32", "f32"), speculation=True).type_v == "bf16"  # F32 keeps its K; V goes per row


@pytest.mark.parametrize("types", [("q8_0", "q8_0"), ("q4_0", "q4_0"), ("bf16", "f16"), ("f16", "q8_0")])
def test_types_that_are_per_row_already_are_kept(types):
    a = layout(types, n_ctx_per_seq=32768, n_parallel=1)
    assert (a.flash, a.type_k, a.type_v, a.per_row) == ("on", *types, True)


def test_every_invariant_cpu_layout_with_flash_attention_is_per_row():
    """The promise: wherever the invariant mode on the CPU takes flash attention, llama.cpp computes each row
    alone (never its split over the cells nor its tiles, which K and V of the same F16 or F32 type allow)."""
    for k in KV_TYPES:
        for v in KV_TYPES:
            for ctx in (512, PER_ROW_MAX_CTX, 65536):
                for n in (1, 4):
                    for spec in (False, True):
                        a = layout((k, v), n_ctx_per_seq=ctx, n_parallel=n, speculation=spec)
                        assert a.flash in ("on", "off")
                        if a.flash == "on":
                            assert per_row_attention((a.type_k, a.type_v)), (k, v, ctx, n, spec)
                        if spec:
                            assert a.per_row


def test_the_mixed_mode_and_gpu_layers():
    assert layout(batch_invariant=False).flash == "auto"
    assert layout(("q8_0", "q8_0"), batch_invariant=False).flash == "on"  # a quantized V needs it
    gpu = layout(cpu_only=False)
    assert (gpu.flash, gpu.type_k) == ("off", "f16") and "GPU" in gpu.reason
    assert layout(("q8_0", "q8_0"), cpu_only=False).flash == "on"


def test_layers_on_other_boxes_get_flash_attention_so_v_is_read_a_layer_at_a_time():
    a = layout(cpu_only=False, remote=True, n_parallel=1)
    assert (a.mode, a.flash, a.type_k, a.type_v) == ("invariant", "on", "f16", "f16")
    assert "other boxes" in a.reason and "untransposed" in a.reason
    assert layout(cpu_only=False, n_parallel=1).flash == "off"  # a local GPU's keeps plain attention
    mixed = layout(batch_invariant=False, cpu_only=False, remote=True)  # serve's default across boxes
    assert mixed.mode == "mixed" and "other boxes" in mixed.reason


def test_a_placement_is_remote_where_it_names_another_boxs_device():
    from host_runtime.gpu.rpc_devices import is_remote

    assert is_remote("RPC0") and is_remote("RPC12")
    assert not any(is_remote(name) for name in ("CUDA0", "Vulkan1", "CPU", "RPC", "RPCx"))
