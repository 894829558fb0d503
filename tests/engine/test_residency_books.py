"""The prefetch ledger (``engine.experts.books``), without a pool, a device or a model."""
import torch

from engine.experts.books import PrefetchLedger
from engine.experts.counters import ResidencyCounters


def _ledger() -> PrefetchLedger:
    return PrefetchLedger(ResidencyCounters(2, 4, torch.device("cpu")))


def test_a_prefetch_used_from_its_slot_is_a_hit_at_its_distance():
    led = _ledger()
    led.issued(5, distance=2)
    assert led.take(5) == 2 and led.take(5) is None              # once: a second use is no prefetch hit
    led.count(hit=True)
    assert (led.counters.prefetch_hits, led.counters.prefetch_wasted) == (1, 0)


def test_losing_its_slot_unused_is_waste_once_and_only_for_prefetches():
    led = _ledger()
    led.issued(3, distance=1)
    led.waste(3)
    led.waste(3)                                                 # already counted
    led.waste(7)                                                 # never prefetched: a demand copy
    assert led.counters.prefetch_wasted == 1 and not led.unused


def test_a_resize_wastes_the_unused_prefetches_it_drops():
    led = _ledger()
    for k in (1, 2, 3):
        led.issued(k, distance=1)
    led.waste_all_but([1, 2, 3, 4], kept={2, 4})
    assert led.counters.prefetch_wasted == 2 and led.unused == {2}


def test_step_end_forgets_distances_of_settled_prefetches():
    led = _ledger()
    led.issued(1, 1)
    led.issued(2, 2)
    led.waste(1)
    led.end_step()
    assert led.distance == {2: 2}
