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


# ---- ResidencyBooks: which expert is in which slot ------------------------------------------------
from engine.experts.admission import admit  # noqa: E402
from engine.experts.residency_books import ResidencyBooks  # noqa: E402


def _books(slots: int = 2, staging: int = 2, placed=((0, 5),)) -> ResidencyBooks:
    books = ResidencyBooks(num_layers=2, num_experts=4)
    books.reset(slots, slots + staging, placed)
    return books


def test_books_place_take_and_release_slots():
    books = _books()
    assert books.slot_of[5] == 0 and books.owner[0] == 5 and books.resident_keys() == [5]
    assert books.free == [1] and books.slots_used() == 1 and not books.full
    slot = books.take_free()
    books.assign(2, slot)
    assert (slot, books.take_free()) == (1, None) and books.resident_slot(2) == 1
    stage = books.take_staging(layer=1)
    books.assign(6, stage)
    assert stage >= books.slots and books.lease == {stage: 1} and books.resident_slot(6) == -1
    assert books.leased_before(2) == [stage] and books.leased_before(1) == []
    assert books.release_staging(stage) == 6 and books.slot_of[6] == -1 and not books.lease
    assert books.stale == {0, 1}                        # both layers' device rows need a push


def test_books_pins_end_with_their_layer():
    books = _books()
    books.current = {1, 2}
    books.prefetched.update({6: 1, 7: 2})
    assert books.pins == {1, 2, 6, 7}
    books.layer_ran(1)
    assert books.pins == {1, 2, 7}
    books.forget_pins()
    assert books.pins == set()


def test_a_full_pool_is_every_key():
    books = ResidencyBooks(num_layers=1, num_experts=3)
    books.reset(3, 3, [(k, k) for k in range(3)])
    assert books.full and books.free == [] and books.staging_free == []


# ---- the admission rule -------------------------------------------------------------------------------
def _admit(cands, cap, room, victims, hot):
    placed = []
    queue = iter(victims)
    n = admit(cands, cap, room, lambda: next(queue, None), hot.__getitem__ if hot is not None else None,
              lambda k, v: placed.append((k, v)))
    assert n == len(placed)
    return placed


def test_admission_takes_room_first_then_only_colder_victims():
    hot = {1: 5.0, 2: 4.0, 3: 1.0, 10: 0.5, 11: 3.0}
    assert _admit([1, 2, 3], cap=3, room=1, victims=[10, 11], hot=hot) == [(1, None), (2, 10)]   # 3 < 11's heat
    assert _admit([1, 2, 3], cap=1, room=5, victims=[], hot=hot) == [(1, None)]                    # the cap
    assert _admit([1, 2], cap=2, room=0, victims=[], hot=hot) == []                                # no victim


def test_admission_without_scores_takes_any_victim():
    assert _admit([1, 2], cap=2, room=0, victims=[10, 11], hot=None) == [(1, 10), (2, 11)]
