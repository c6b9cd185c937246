"""Mixture-of-experts placement (pure): the planner keeps routed experts in host RAM where whole layers do not fit
the GPUs, on the tensor tables of real MoE models (sparse GGUFs: the published files' tables, no weights)."""

from __future__ import annotations

import re

import pytest

from host_runtime.placement.model_table import experts_override_pattern, is_expert_weight, read_table
from host_runtime.placement.planner import GIB, Host, PlanRequest, plan, weights_pad
from host_runtime.placement.render import render_table
from tests.sparse_gguf import gpt_oss_120b, qwen3_30b_a3b
from tests.test_placement_planner import BIG_HOST, RTX3090, assert_sound, card, llama8b


@pytest.fixture(scope="module")
def qwen3_moe(tmp_path_factory):
    return read_table(qwen3_30b_a3b(tmp_path_factory.mktemp("sparse") / "Qwen3-30B-A3B-Q4_K_M.gguf"))


@pytest.fixture(scope="module")
def gpt_oss(tmp_path_factory):
    return read_table(gpt_oss_120b(tmp_path_factory.mktemp("sparse") / "gpt-oss-120b-MXFP4.gguf"))


RTX3060 = card("CUDA0", "NVIDIA GeForce RTX 3060", 12, gbps=360)
HOST_64 = Host(available_bytes=56 * GIB, total_bytes=64 * GIB)


def experts_below(model, n: int) -> int:
    return sum(model.layer_expert_bytes(il) for il in range(n))


def test_the_sparse_tables_read_as_the_published_models(qwen3_moe, gpt_oss):
    assert (qwen3_moe.architecture, qwen3_moe.n_layer, qwen3_moe.n_expert, qwen3_moe.n_expert_used) == ("qwen3moe", 48, 128, 8)
    assert 18.4e9 < qwen3_moe.file_bytes < 18.8e9 and qwen3_moe.is_moe
    # Experts are most of the bytes: about 95% of the 30B, 96% of the 120B.
    assert 0.93 < experts_below(qwen3_moe, 48) / qwen3_moe.total_weight_bytes() < 0.97
    assert (gpt_oss.architecture, gpt_oss.n_layer, gpt_oss.n_expert, gpt_oss.n_expert_used) == ("gpt-oss", 36, 128, 4)
    assert 63e9 < gpt_oss.file_bytes < 64e9
    # llama.cpp gives gpt-oss a sliding window on every other layer in code (its GGUF does not say which)
    assert gpt_oss.swa_layers == frozenset(range(0, 36, 2)) and gpt_oss.n_swa == 128
    assert not llama8b().is_moe


def test_the_override_names_exactly_the_expert_weights_of_the_layers_below_n(gpt_oss):
    names = [t.name for layer in gpt_oss.layer_tensors for t in layer]
    pattern = re.compile(experts_override_pattern(3, gpt_oss.n_layer))
    matched = {n for n in names if pattern.search(n)}
    assert matched == {f"blk.{i}.ffn_{p}_exps.weight" for i in range(3) for p in ("gate", "up", "down")}
    # biases, the router, and blk.13 / blk.30 (which a careless "blk.1" or "blk.3" prefix would catch) stay
    assert not any(n.endswith(".bias") or "gate_inp" in n for n in matched)
    every = re.compile(experts_override_pattern(36, 36))
    assert {n for n in names if every.search(n)} == {n for n in names if is_expert_weight(n)}
    assert len({n for n in names if is_expert_weight(n)}) == 3 * 36


def test_a_12_gb_card_takes_every_layers_attention_and_the_fewest_experts_go_to_host_ram(qwen3_moe):
    request = PlanRequest(n_ctx_per_seq=32768, n_parallel=1)
    p = plan(qwen3_moe, [RTX3060], HOST_64, request)
    assert_sound(p, qwen3_moe)
    assert p.n_gpu_layers == 49 and p.cpu_share.n_layers == 0, "all 48 layers and the head on the card"
    assert 0 < p.n_cpu_moe < 48
    assert p.experts_pattern == experts_override_pattern(p.n_cpu_moe, 48)
    gpu, cpu = p.gpu_shares[0], p.cpu_share
    assert cpu.expert_bytes == experts_below(qwen3_moe, p.n_cpu_moe)
    assert cpu.weights_bytes == qwen3_moe.input_weight_bytes() + cpu.expert_bytes
    assert gpu.expert_bytes == sum(qwen3_moe.layer_expert_bytes(il, weights_pad(RTX3060)) for il in range(p.n_cpu_moe, 48))
    # The fewest: one layer's experts fewer in host RAM and not every layer fits the card.
    fewer = plan(qwen3_moe, [RTX3060], HOST_64, PlanRequest(n_ctx_per_seq=32768, n_parallel=1,
                                                             n_cpu_moe=p.n_cpu_moe - 1))
    assert fewer.cpu_share.n_layers > 0
    # Whole layers (llama.cpp without the override) leave about half the model's attention on the CPU, and read
    # more from host RAM a token than the plan does.
    whole = plan(qwen3_moe, [RTX3060], HOST_64, PlanRequest(n_ctx_per_seq=32768, n_parallel=1, n_cpu_moe=0))
    assert 10 < whole.cpu_share.n_layers < 40
    bandwidth = {"CUDA0": 360.0, "CPU": HOST_64.bandwidth_gbps}
    assert p.decode_seconds_per_token(bandwidth) < whole.decode_seconds_per_token(bandwidth)
    assert any("--n-cpu-moe" in n and "48 of 48 layers' attention" in n for n in p.notes)


def test_where_the_whole_model_fits_no_expert_leaves_the_card(qwen3_moe):
    p = plan(qwen3_moe, [RTX3090(0)], BIG_HOST, PlanRequest(n_ctx_per_seq=8192, n_parallel=1))
    assert p.n_gpu_layers == 49 and p.n_cpu_moe == 0 and p.experts_pattern is None
    assert p.cpu_share.expert_bytes == 0


def test_gpt_oss_120b_on_one_3090_keeps_most_experts_in_ram_and_every_layer_on_the_card(gpt_oss):
    p = plan(gpt_oss, [RTX3090(0)], BIG_HOST, PlanRequest(n_ctx_per_seq=32768, n_parallel=1))
    assert_sound(p, gpt_oss)
    assert p.n_gpu_layers == 37 and p.cpu_share.n_layers == 0
    assert 24 <= p.n_cpu_moe < 36, p.n_cpu_moe  # a 24 GiB card holds the experts of a few layers (1.7 GB each)
    two = plan(gpt_oss, [RTX3090(0), RTX3090(1)], BIG_HOST, PlanRequest(n_ctx_per_seq=32768, n_parallel=1))
    assert_sound(two, gpt_oss)
    assert two.n_gpu_layers == 37 and two.n_cpu_moe < p.n_cpu_moe
    assert two.experts_pattern == experts_override_pattern(two.n_cpu_moe, 36)
    # where no card is there is nothing to override
    cpu = plan(gpt_oss, [], BIG_HOST, PlanRequest(n_ctx_per_seq=32768, n_parallel=1))
    assert cpu.n_gpu_layers == 0 and cpu.experts_pattern is None


def test_a_card_too_small_for_every_layers_attention_keeps_all_experts_in_ram_and_some_layers_on_the_cpu(gpt_oss):
    small = card("CUDA0", "NVIDIA GeForce RTX 3060", 4, gbps=360)
    p = plan(gpt_oss, [small], BIG_HOST, PlanRequest(n_ctx_per_seq=32768, n_parallel=1))
    assert_sound(p, gpt_oss)
    assert p.n_cpu_moe == 36 and 0 < p.cpu_share.n_layers < 36
    assert p.experts_pattern == experts_override_pattern(36, 36) == r"\.ffn_(up|down|gate|gate_up)_exps\.weight"


def test_explicit_cpu_moe_settings_are_kept_as_given(qwen3_moe):
    # --cpu-moe with every layer offloaded, as llama-server's -ngl 99 --cpu-moe
    p = plan(qwen3_moe, [RTX3090(0)], BIG_HOST, PlanRequest(n_ctx_per_seq=8192, n_parallel=1, n_gpu_layers=49,
                                                            n_cpu_moe=1 << 16))
    assert p.n_cpu_moe == 48 and p.explicit and p.gpu_shares[0].expert_bytes == 0
    assert p.cpu_share.expert_bytes == experts_below(qwen3_moe, 48)
    q = plan(qwen3_moe, [RTX3090(0)], BIG_HOST, PlanRequest(n_ctx_per_seq=8192, n_parallel=1, n_cpu_moe=10))
    assert q.n_cpu_moe == 10 and q.cpu_share.expert_bytes == experts_below(qwen3_moe, 10)
    dense = plan(llama8b(), [RTX3090(0)], BIG_HOST, PlanRequest(n_ctx_per_seq=8192, n_parallel=1, n_cpu_moe=10))
    assert dense.n_cpu_moe == 0 and dense.experts_pattern is None


def test_plan_shows_where_the_experts_are(qwen3_moe):
    p = plan(qwen3_moe, [RTX3060], HOST_64, PlanRequest(n_ctx_per_seq=32768, n_parallel=1))
    text = render_table(p, proven=False)
    assert f"experts: layers 0-{p.n_cpu_moe - 1} keep their expert weights in host RAM" in text
    assert f"--n-cpu-moe {p.n_cpu_moe}" in text
    doc = p.to_json()
    assert doc["n_cpu_moe"] == p.n_cpu_moe and doc["experts_override"] == p.experts_pattern
    assert doc["devices"][-1]["expert_bytes"] == experts_below(qwen3_moe, p.n_cpu_moe)


def test_experts_on_the_cpu_are_not_padded_as_cudas_are(qwen3_moe):
    # CUDA pads a quantized tensor whose rows are not a multiple of 512 values; the experts' down projection
    # (768-value rows) is such a tensor, so the same layer costs more on the card than in host RAM.
    p = plan(qwen3_moe, [RTX3060], HOST_64, PlanRequest(n_ctx_per_seq=32768, n_parallel=1))
    gpu = p.gpu_shares[0]
    assert gpu.expert_bytes > sum(qwen3_moe.layer_expert_bytes(il) for il in range(p.n_cpu_moe, 48))
