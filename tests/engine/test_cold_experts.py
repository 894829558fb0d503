"""Cold experts (engine/experts/cold.py): the cost model, auto's choice of step kind, and the engine
with missing experts computed by the host CPU generating what the bus alone does."""
from __future__ import annotations

import dataclasses

import pytest

from engine import LLM, SamplingParams
from engine.errors import ConfigError, ReconfigureError
from engine.experts.cold import ColdRates, StepArms, split_layer
from kernels.cpu import CpuExpertCost
from test_experts_support import generate_with_changes
from tiny_models import build_tiny_model

MB = 1 << 20
# bus 50 GB/s; the CPU 2 ms per 100 MB expert at one token, +0.5 ms per extra token
RATES = ColdRates(50e9, CpuExpertCost("bf16", 100 * MB, 1, (1, 2, 4, 8), (2e-3, 2.5e-3, 3.5e-3, 5.5e-3), 16))


def test_split_keeps_every_expert_on_the_bus_or_the_cpu_as_told() -> None:
    uses = {10: 1, 11: 1, 12: 3}
    assert split_layer(uses, 100 * MB, RATES, "bus", direct=True).cpu == frozenset()
    assert split_layer(uses, 100 * MB, RATES, "cpu", direct=True).cpu == frozenset(uses)
    assert split_layer({}, 100 * MB, RATES, "auto", direct=True).cpu == frozenset()


@pytest.mark.parametrize("call_s", (0.0, 1e-3))
def test_the_cpu_rate_is_learnt_from_what_the_kernels_took(call_s) -> None:
    # The calibration read the CPU 8x slower than the steps find it (a host busy at that moment):
    # the layers move the rates to what the kernels take, the fixed call cost aside, and auto's split
    # follows; one outlier moves the rate little.
    from engine.experts.cold import ColdExperts
    from kernels.expert_layout import ExpertLayout
    cold = ColdExperts(ExpertLayout.make("bf16", 64, 32), mode="auto", threads=1)
    slow = dataclasses.replace(RATES.cpu, seconds=tuple(8 * s for s in RATES.cpu.seconds))
    cold.rates = ColdRates(RATES.bus_bytes_per_s, slow, cpu_call_s=call_s)
    uses = {k: 1 for k in range(8)}
    assert len(split_layer(uses, 100 * MB, cold.rates, "auto", direct=True).cpu) <= 1
    for _ in range(150):
        cold.learn_cpu(call_s + 3 * 2e-3, [1, 1, 1])     # three experts of one token: 2 ms each
    assert cold.rates.cpu_s(1) == pytest.approx(2e-3, rel=0.05)
    assert len(split_layer(uses, 100 * MB, cold.rates, "auto", direct=True).cpu) >= 3
    cold.learn_cpu(call_s + 3 * 14e-3, [1, 1, 1])        # a layer hit by a time slice: 7x slow
    assert cold.rates.cpu_s(1) == pytest.approx(2e-3, rel=0.05)
    cold.learn_cpu(0.0, [1])                             # nothing measured: nothing learnt
    cold.learn_cpu(1.0, [])
    assert cold.rates.cpu_s(1) == pytest.approx(2e-3, rel=0.05)


def test_a_step_whose_kernels_carry_the_bus_is_weighed_at_their_rate() -> None:
    # The GPU's kernels read the mapped store at 20 GB/s where the copy engine moves 50: a direct-read
    # step's layer (its missing experts copied in by the gather's kernel, once each) gives the CPU more
    # than a copy step's layer does, and predicts its bus time at the kernels' rate.
    rates = dataclasses.replace(RATES, kernel_bus_bytes_per_s=20e9)
    assert rates.bus_s(100 * MB, direct=True) == pytest.approx(100 * MB / 20e9)
    assert rates.bus_s(100 * MB) == RATES.bus_s(100 * MB)
    uses = {k: 1 for k in range(8)}
    copies = split_layer(uses, 100 * MB, rates, "auto", direct=False)
    kernels = split_layer(uses, 100 * MB, rates, "auto", direct=False, by_kernels=True)
    assert len(copies.cpu) == 4 and len(kernels.cpu) == 6
    assert kernels.bus_s == pytest.approx(2 * 100 * MB / 20e9)
    unmeasured = split_layer(uses, 100 * MB, RATES, "auto", direct=False, by_kernels=True)
    assert unmeasured == copies                          # no kernel rate: the copy engine's stands in


def test_auto_balances_bus_and_cpu() -> None:
    uses = {k: 1 for k in range(8)}                        # a batch-1 layer: 8 experts of one token
    s = split_layer(uses, 100 * MB, RATES, "auto", direct=True)
    alone = split_layer(uses, 100 * MB, RATES, "bus", direct=True)
    # 2.1 ms per expert over the bus, 2 ms on the CPU: half and half finish together
    assert len(s.cpu) == 4
    assert s.predicted_s < alone.predicted_s
    assert abs(s.bus_s - s.cpu_s) <= RATES.bus_s(100 * MB)


def test_auto_gives_the_cpu_the_experts_many_tokens_read_directly() -> None:
    # read directly, an expert of 8 tokens crosses the bus 8 times (16.8 ms); the CPU takes 5.5 ms
    s = split_layer({1: 8, 2: 1, 3: 1}, 100 * MB, RATES, "auto", direct=True)
    assert 1 in s.cpu


def test_prefill_copies() -> None:
    # 512 tokens per expert: one copy (2.1 ms) beats the CPU's ~260 ms
    s = split_layer({k: 512 for k in range(4)}, 100 * MB, RATES, "auto", direct=False)
    assert s.cpu == frozenset()


def test_step_arms_try_both_then_keep_the_faster_and_probe() -> None:
    arms = StepArms(trials=2, probe_every=10)
    times = {False: 0.010, True: 0.006}
    picked = []
    for _ in range(40):
        eager = arms.choose(8)
        picked.append(eager)
        arms.observe(8, eager, times[eager])
    assert picked[:3] == [False] * 3 and picked[3:6] == [True] * 3     # each arm: trials + its first step
    rest = picked[6:]
    assert rest.count(True) > 0.8 * len(rest) and False in rest       # the faster, and probes of the other
    assert arms.state()[8][1] == pytest.approx(0.006)
    arms.reset()
    assert arms.choose(8) is False


PROMPTS = [[1, 5, 77, 300, 12, 9, 400, 33], [1, 99, 4], [1, 250, 251, 252, 17]]
GREEDY = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = build_tiny_model(tmp_path_factory.mktemp("qwen3_moe_cold"), "qwen3_moe")
    with LLM(str(path), device="cpu", dtype="float32") as llm:
        ref = [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]
        info = llm.engine.loaded
        keys, nbytes = info.spec.num_moe_layers * info.spec.num_experts, info.layout.nbytes
    return path, ref, keys, nbytes


@pytest.mark.parametrize("frac, depth, reads", [(0.0, 0, "auto"), (0.5, 2, "auto"), (0.0, 2, "direct"),
                                                (0.5, 1, "direct")])
def test_cpu_experts_generate_what_the_bus_does(model, frac, depth, reads) -> None:
    path, ref, keys, nbytes = model
    with LLM(str(path), device="cpu", dtype="float32", expert_pool_size=int(frac * keys) * nbytes,
             prefetch_depth=depth, expert_reads=reads, cold_experts="cpu") as llm:
        assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY)] == ref
        st = llm.stats().experts
        assert st.cold_mode == "cpu" and st.misses > 0
        assert st.cpu_experts == st.misses and st.bus_experts == 0      # every missing expert on the CPU
        assert st.direct_bytes == 0 and st.cpu_ms > 0 and st.cold_measured_ms >= st.cpu_ms
        assert st.steps_ms > 0 and st.cold_predicted_ms > 0


def test_cold_experts_change_live_and_refuse_bad_values(model) -> None:
    path, ref, keys, nbytes = model
    with LLM(str(path), device="cpu", dtype="float32", expert_pool_size=(keys // 4) * nbytes,
             cold_experts="bus") as llm:
        eng = llm.engine
        modes = ["cpu", "bus", "auto"]
        out, step = generate_with_changes(llm, PROMPTS, GREEDY, lambda s: {"cold_experts": modes[s % 3]})
        assert out == ref
        assert llm.stats().experts.cpu_experts > 0
        with pytest.raises(ReconfigureError, match="cold_experts"):
            eng.reconfigure(cold_experts="gpu")
        last = modes[(step - 1) % 3]                            # the last accepted value stays
        assert eng.config.cold_experts == last and eng.loaded.experts.cold.mode == last


def test_a_bad_cold_experts_value_is_one_clear_line(model) -> None:
    with pytest.raises(ConfigError) as e:
        LLM(str(model[0]), device="cpu", cold_experts="sometimes")
    assert "cold_experts" in str(e.value) and "auto" in str(e.value) and "\n" not in str(e.value)
