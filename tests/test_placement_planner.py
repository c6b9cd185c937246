"""The placement planner on topologies written as data (pure: no llama.cpp, no GPU)."""

from __future__ import annotations

import pytest

from host_runtime.placement.model_table import synthetic_table
from host_runtime.placement.planner import (GIB, MIB, Device, Host, PlacementError, PlanRequest, compute_estimate,
                                            plan)

Q4_K, Q6_K, F32, F16, Q4_1 = 12, 14, 0, 1, 3
Q4_K_M = {"attn_q": Q4_K, "attn_k": Q4_K, "attn_v": Q6_K, "attn_output": Q4_K, "ffn_gate": Q4_K, "ffn_up": Q4_K,
          "ffn_down": Q6_K, "token_embd": Q4_K, "output": Q6_K, "norm": F32}


def llama70b():
    return synthetic_table(name="Llama-3.3-70B-Instruct-Q4_K_M", n_layer=80, n_embd=8192, n_ff=28672, n_head=64,
                           n_head_kv=8, n_vocab=128256, n_ctx_train=131072, types=Q4_K_M)


def llama8b():
    return synthetic_table(name="Llama-3.1-8B-Instruct-Q4_K_M", n_layer=32, n_embd=4096, n_ff=14336, n_head=32,
                           n_head_kv=8, n_vocab=128256, n_ctx_train=131072, types=Q4_K_M)


def card(name: str, desc: str, total_gib: float, free_gib: float | None = None, gbps: float = 936.0) -> Device:
    total = int(total_gib * GIB)
    free = int((free_gib if free_gib is not None else total_gib - 0.3) * GIB)
    return Device(name=name, description=desc, free_bytes=free, total_bytes=total, bandwidth_gbps=gbps, backend="CUDA")


RTX3090 = lambda i: card(f"CUDA{i}", "NVIDIA GeForce RTX 3090", 24, gbps=936)  # noqa: E731
BIG_HOST = Host(available_bytes=120 * GIB, total_bytes=128 * GIB)


def assert_sound(p, model):
    """Every layer placed exactly once, in llama.cpp's order, nothing past its capacity."""
    ranges = [(s.first_layer, s.last_layer) for s in p.shares]
    cpu_first, cpu_last = ranges[-1]
    assert cpu_first == 0
    edge = cpu_last
    for first, last in ranges[:-1]:  # the GPUs take consecutive runs above the CPU's, in device order
        assert first == edge
        edge = last
    assert edge == model.n_layer
    assert sum(s.holds_output for s in p.shares) == 1
    if p.gpu_shares:
        assert p.gpu_shares[-1].holds_output, "llama.cpp puts the output layer on the last device of the list"
        assert p.n_gpu_layers == sum(s.n_layers for s in p.gpu_shares) + 1
    for s in p.shares:
        assert s.used_bytes <= s.capacity_bytes, s
        assert s.capacity_bytes == max(0, s.free_bytes - s.margin_bytes)


def test_cpu_only_box_keeps_every_layer_on_the_cpu():
    model = llama8b()
    p = plan(model, [], Host(available_bytes=30 * GIB, total_bytes=32 * GIB), PlanRequest(n_ctx_per_seq=8192))
    assert_sound(p, model)
    assert p.n_gpu_layers == 0 and p.device_order == () and p.cpu_share.n_layers == 32
    assert p.cpu_share.holds_output
    assert p.cpu_share.weights_bytes == model.total_weight_bytes()


def test_one_3090_and_128_gb_takes_the_top_half_of_a_70b_and_its_head():
    model = llama70b()
    p = plan(model, [RTX3090(0)], BIG_HOST, PlanRequest(n_ctx_per_seq=8192, n_parallel=1))
    assert_sound(p, model)
    gpu = p.gpu_shares[0]
    assert gpu.device == "CUDA0" and gpu.holds_output
    assert 30 <= gpu.n_layers <= 45
    # Filled to within one layer of its capacity: the margin is the only slack.
    one_layer = model.layer_weight_bytes(79) + model.kv_layer_bytes(79, 8192, 1)
    assert 0 <= gpu.left_bytes < one_layer
    assert gpu.margin_bytes == max(int(24 * GIB * 0.05), 512 * MIB)
    assert p.cpu_share.n_layers == 80 - gpu.n_layers


def test_two_3090s_split_the_model_and_only_the_last_holds_the_head():
    model = llama70b()
    p = plan(model, [RTX3090(0), RTX3090(1)], BIG_HOST, PlanRequest(n_ctx_per_seq=8192, n_parallel=1))
    assert_sound(p, model)
    assert len(p.gpu_shares) == 2
    assert sum(s.n_layers for s in p.gpu_shares) >= 70
    assert p.tensor_split == tuple(float(s.n_layers + s.holds_output) for s in p.gpu_shares)


def test_a_3090_beside_a_1080ti_fills_the_faster_card_first_and_gives_it_the_head():
    model = llama70b()
    slow = card("CUDA1", "NVIDIA GeForce GTX 1080 Ti", 11, gbps=484)
    p = plan(model, [slow, RTX3090(0)], BIG_HOST, PlanRequest(n_ctx_per_seq=4096, n_parallel=1))
    assert_sound(p, model)
    assert p.device_order == ("CUDA1", "CUDA0")  # llama.cpp's list: the slow card's run below the fast one's
    fast_share = p.gpu_shares[1]
    assert fast_share.device == "CUDA0" and fast_share.holds_output
    assert fast_share.n_layers > p.gpu_shares[0].n_layers


def test_p40_and_2060_order_by_bandwidth_not_by_size():
    model = llama8b()
    p40 = card("CUDA0", "Tesla P40", 24, gbps=346)
    rtx2060 = card("CUDA1", "NVIDIA GeForce RTX 2060", 6, gbps=336)
    p = plan(model, [rtx2060, p40], BIG_HOST, PlanRequest(n_ctx_per_seq=8192, n_parallel=2))
    assert_sound(p, model)
    # The whole 8B fits the P40: the 2060 gets nothing and is left out of llama.cpp's device list.
    assert p.device_order == ("CUDA0",)
    assert p.gpu_shares[0].n_layers == 32 and p.cpu_share.n_layers == 0
    assert any("CUDA1" in n for n in p.notes)


def test_four_3090s_and_a_small_fifth_card_terminate_with_every_layer_placed():
    """The shape that loops forever in llama.cpp's --fit (#18337)."""
    model = llama70b()
    small = card("CUDA4", "NVIDIA GeForce RTX 5060 Ti", 16, gbps=448)
    p = plan(model, [RTX3090(i) for i in range(4)] + [small], BIG_HOST, PlanRequest(n_ctx_per_seq=32768,
                                                                                      n_parallel=4))
    assert_sound(p, model)
    assert p.cpu_share.n_layers == 0
    assert "CUDA4" not in p.device_order or p.gpu_shares[0].device == "CUDA4"  # the slowest card is filled last


def test_a_card_with_1_gib_free_is_left_out_with_a_reason():
    model = llama70b()
    tight = card("Vulkan0", "AMD Radeon RX 580", 8, free_gib=1.0, gbps=256)
    p = plan(model, [tight], BIG_HOST, PlanRequest(n_ctx_per_seq=4096, n_parallel=1))
    assert_sound(p, model)
    assert p.device_order == () and p.n_gpu_layers == 0
    assert any(n.startswith("Vulkan0 (AMD Radeon RX 580) unused") for n in p.notes)


def test_a_model_that_cannot_fit_is_refused_with_the_device_and_the_shortfall():
    model = llama70b()
    with pytest.raises(PlacementError) as err:
        plan(model, [], Host(available_bytes=14 * GIB, total_bytes=16 * GIB), PlanRequest(n_ctx_per_seq=4096))
    text = str(err.value)
    assert "does not fit" in text and "host RAM" in text and "short by" in text and "GiB" in text


def test_too_long_a_context_is_lowered_and_the_plan_says_so():
    model = llama8b()
    host = Host(available_bytes=14 * GIB, total_bytes=16 * GIB)
    p = plan(model, [], host, PlanRequest(n_ctx_per_seq=131072, n_parallel=1))
    assert_sound(p, model)
    assert p.n_ctx_per_seq < 131072
    assert any("lowered the context" in n for n in p.notes)


def test_auto_parallel_follows_the_kv_budget_and_is_lowered_before_the_context():
    model = llama8b()
    per_seq = model.kv_bytes_per_token() * 8192
    roomy = plan(model, [], BIG_HOST, PlanRequest(n_ctx_per_seq=8192, kv_budget_bytes=4 * per_seq))
    assert roomy.n_parallel == 4 and roomy.max_waiting == 16
    host = Host(available_bytes=int(model.total_weight_bytes() + 2.5 * per_seq + 1.5 * GIB), total_bytes=16 * GIB)
    tight = plan(model, [], host, PlanRequest(n_ctx_per_seq=8192, kv_budget_bytes=4 * per_seq))
    assert tight.n_ctx_per_seq == 8192 and tight.n_parallel in (1, 2)
    assert any("parallel sequences" in n for n in tight.notes)


def test_explicit_gpu_layers_follow_llama_cpps_rule():
    model = llama8b()
    p = plan(model, [RTX3090(0)], BIG_HOST, PlanRequest(n_ctx_per_seq=4096, n_parallel=1, n_gpu_layers=5))
    # ngl counts the output layer first: 5 means the head and the top 4 blocks.
    assert p.explicit and p.n_gpu_layers == 5
    assert (p.gpu_shares[0].first_layer, p.gpu_shares[0].last_layer) == (28, 32) and p.gpu_shares[0].holds_output
    one = plan(model, [RTX3090(0)], BIG_HOST, PlanRequest(n_ctx_per_seq=4096, n_parallel=1, n_gpu_layers=1))
    assert one.gpu_shares[0].n_layers == 0 and one.gpu_shares[0].holds_output


def test_the_planned_split_read_back_by_llama_cpps_rule_gives_the_same_layers():
    model = llama70b()
    slow = card("CUDA1", "NVIDIA GeForce GTX 1080 Ti", 11, gbps=484)
    auto = plan(model, [slow, RTX3090(0)], BIG_HOST, PlanRequest(n_ctx_per_seq=4096, n_parallel=1))
    by_name = {d.name: d for d in [slow, RTX3090(0)]}
    again = plan(model, [by_name[n] for n in auto.device_order], BIG_HOST,
                 PlanRequest(n_ctx_per_seq=4096, n_parallel=1, n_gpu_layers=auto.n_gpu_layers,
                             tensor_split=auto.tensor_split))
    assert [(s.device, s.first_layer, s.last_layer, s.holds_output) for s in again.shares] == \
        [(s.device, s.first_layer, s.last_layer, s.holds_output) for s in auto.shares]


def test_an_explicit_split_that_overfills_a_card_is_refused_naming_it():
    model = llama70b()
    with pytest.raises(PlacementError, match=r"CUDA0 \(NVIDIA GeForce RTX 3090\) would need .* short by"):
        plan(model, [RTX3090(0)], BIG_HOST, PlanRequest(n_ctx_per_seq=4096, n_parallel=1, n_gpu_layers=81))


def test_explicit_settings_the_box_cannot_honour_are_named():
    model = llama8b()
    with pytest.raises(PlacementError, match="--gpu-layers 10: this box has no GPU"):
        plan(model, [], BIG_HOST, PlanRequest(n_gpu_layers=10))
    with pytest.raises(PlacementError, match="--tensor-split: 2 values for 1 GPU"):
        plan(model, [RTX3090(0)], BIG_HOST, PlanRequest(tensor_split=(1.0, 1.0)))


def test_measured_compute_buffers_replace_the_estimate():
    model = llama8b()
    est = plan(model, [RTX3090(0)], BIG_HOST, PlanRequest(n_ctx_per_seq=4096, n_parallel=1))
    measured = plan(model, [RTX3090(0)], BIG_HOST, PlanRequest(n_ctx_per_seq=4096, n_parallel=1,
                                                               measured_compute={"CUDA0": 3 * GIB, "CPU": 10 * MIB}))
    assert est.gpu_shares[0].compute_bytes == compute_estimate(model, 512, 4096, True, True)
    assert measured.gpu_shares[0].compute_bytes == 3 * GIB and measured.gpu_shares[0].compute_measured
    assert measured.cpu_share.compute_bytes == 10 * MIB


def test_sliding_window_layers_cost_only_their_window():
    swa = synthetic_table(name="swa", n_layer=6, n_embd=1024, n_ff=4096, n_head=8, n_head_kv=4, n_vocab=32000,
                          n_ctx_train=32768, types={"norm": F32}, n_swa=1024, swa_pattern=3)
    assert swa.swa_layers == frozenset({0, 1, 3, 4})
    assert swa.kv_cells(0, 32768, 2, 512) == 1536 * 2  # window + batch, padded to 256, per sequence
    assert swa.kv_cells(2, 32768, 2, 512) == 32768 * 2


def test_the_synthetic_table_matches_a_real_gguf_of_the_same_architecture(tmp_path):
    """Tables for large models are built from hyperparameters: check the builder against a file llama.cpp loads."""
    from host_runtime.placement.model_table import read_table
    from tests.tiny_gguf import write_tiny_llama

    path = write_tiny_llama(tmp_path / "tiny.gguf", n_embd=64, n_layer=3, n_head=4, n_ff=128)
    real = read_table(path)
    built = synthetic_table(name="tiny", n_layer=3, n_embd=64, n_ff=128, n_head=4, n_head_kv=4, n_vocab=259,
                            n_ctx_train=64, types={"norm": F32})
    assert [built.layer_weight_bytes(i) for i in range(3)] == [real.layer_weight_bytes(i) for i in range(3)]
    assert built.output_weight_bytes() == real.output_weight_bytes()
    assert built.input_weight_bytes() == real.input_weight_bytes()
    assert built.kv_bytes_per_token() == real.kv_bytes_per_token() == 3 * 2 * 64 * 2
    assert real.n_vocab == 259 and not real.tied_output


def test_a_card_slower_than_the_hosts_ram_takes_only_what_the_cpu_cannot_hold():
    model = llama8b()
    lavapipe = Device("Vulkan0", "llvmpipe (LLVM 15.0.6, 256 bits)", 2 * GIB, 2 * GIB, 20.0, backend="Vulkan")
    roomy = plan(model, [lavapipe], BIG_HOST, PlanRequest(n_ctx_per_seq=4096, n_parallel=1))
    assert roomy.n_gpu_layers == 0
    assert any("Vulkan0 (llvmpipe" in n and "slower than the CPU" in n for n in roomy.notes)
    host = Host(available_bytes=int(model.total_weight_bytes() * 0.9) + 2 * GIB, total_bytes=16 * GIB)
    tight = plan(model, [lavapipe], host, PlanRequest(n_ctx_per_seq=4096, n_parallel=1))
    assert tight.device_order == ("Vulkan0",) and tight.gpu_shares[0].n_layers > 0
    assert_sound(tight, model)


def test_a_70b_fits_a_3090_box_only_with_two_more_boxes_lending_their_ram():
    """#60: another box's lent CPU is a device with what it lends and no margin of the holder's (the member kept
    its own); the holder's --models-memory-mib bounds its RAM however much is available."""
    model = llama70b()
    host = Host(available_bytes=120 * GIB, total_bytes=128 * GIB, budget_bytes=12 * GIB)
    request = PlanRequest(n_ctx_per_seq=8192, n_parallel=1)
    with pytest.raises(PlacementError, match="host RAM"):
        plan(model, [RTX3090(0)], host, request)
    members = [Device(f"RPC{i}", f"10.0.0.{3 + i}:50052 CPU", 9 * GIB, 64 * GIB, 40.0, backend="RPC")
               for i in range(2)]
    p = plan(model, [RTX3090(0), *members], host, request)
    assert_sound(p, model)
    # the card, fastest, last in llama.cpp's list (the top layers and the head); the members' before it
    assert p.device_order[-1] == "CUDA0" and set(p.device_order[:-1]) == {"RPC0", "RPC1"}
    assert all(s.margin_bytes == 0 and 8 * GIB < s.used_bytes <= 9 * GIB for s in p.gpu_shares if s.device != "CUDA0")
    assert p.cpu_share.capacity_bytes == 12 * GIB and p.cpu_share.n_layers > 0  # the budget, not what is available


def test_the_api_has_a_thread_for_every_request_the_engine_admits_and_some_for_health_checks():
    from host_runtime.placement.planner import MAX_PARALLEL, QUEUE_PER_SEQUENCE
    from host_runtime.serving.http_threads import CONTROL_RESERVE, MIN_THREADS, http_threads

    assert http_threads(4, 256) == 4 + 256 + CONTROL_RESERVE
    # unknown until the planner runs: sized for the most it may choose
    assert http_threads(None, None) == MAX_PARALLEL * (1 + QUEUE_PER_SEQUENCE) + CONTROL_RESERVE
    assert http_threads(2, None) == max(MIN_THREADS, 2 + 2 * QUEUE_PER_SEQUENCE + CONTROL_RESERVE)
    assert http_threads(1, 0) == MIN_THREADS
