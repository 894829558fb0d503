"""Predicting or quiet replays of direct-read decode steps, chosen by measured step times
(engine/experts/predict_tuner.py), and how that choice shares the steps with the CPU share's tuner."""
from __future__ import annotations

from types import SimpleNamespace

import torch

from engine.experts.cold_graph import GraphCpuShares, ShareTuner
from engine.experts.predict_tuner import PredictTuner
from engine.experts.replay_choice import ReplayChooser


def run(tuner: PredictTuner, tokens: int, seconds, steps: int) -> list[bool]:
    picks = []
    for _ in range(steps):
        pick = tuner.choose(tokens)
        picks.append(pick)
        tuner.observe(tokens, pick, seconds(pick))
    return picks


def test_each_step_size_replays_the_recording_measured_faster() -> None:
    # Steps of one token are faster without predictions, steps of eight with them: each size keeps its own.
    tuner = PredictTuner(trials=3, probe_every=8)
    run(tuner, 1, lambda p: 1.2 if p else 1.0, 40)
    run(tuner, 8, lambda p: 2.0 if p else 2.4, 40)
    state = tuner.state()
    assert state[1][0] is False and state[8][0] is True
    assert state[1][1] == {True: 1.2, False: 1.0}
    assert state[8][1] == {True: 2.0, False: 2.4}


def test_the_tuner_follows_when_the_faster_recording_changes() -> None:
    # The routing moves (guesses get better): predicting becomes the faster; a later probe finds it.
    tuner = PredictTuner(trials=2, probe_every=6)
    run(tuner, 1, lambda p: 1.2 if p else 1.0, 30)
    assert tuner.state()[1][0] is False
    run(tuner, 1, lambda p: 0.8 if p else 1.0, 60)
    assert tuner.state()[1][0] is True


def test_the_first_step_after_a_recording_is_not_a_measure() -> None:
    # The first step records both graphs and takes fifty times as long; predicting is the faster all
    # the same, and the tuner ends on it. After a new recording the same holds.
    tuner = PredictTuner(trials=3, probe_every=8)
    times = iter([50.0])
    for _ in range(20):
        pick = tuner.choose(1)
        tuner.observe(1, pick, next(times, 1.0 if pick else 1.3))
    assert tuner.state()[1][0] is True
    tuner.recorded()
    pick = tuner.choose(1)
    tuner.observe(1, pick, 50.0)
    assert max(tuner.state()[1][1].values()) < 2.0


def test_probes_of_a_far_slower_recording_are_short_and_rare() -> None:
    # Quiet steps take five times as long: each probe ends after one step, and probes come less and
    # less often, so nearly every step predicts.
    tuner = PredictTuner(trials=3, probe_every=6, start=True)
    picks = run(tuner, 1, lambda p: 1.0 if p else 5.0, 400)
    assert tuner.state()[1][0] is True
    assert sum(not p for p in picks) <= 12                 # one step a probe, each wait doubling to 8 x 6
    assert sum(not p for p in picks[100:]) <= 300 // 48 + 1


def test_a_probe_waits_while_another_tuner_measures() -> None:
    tuner = PredictTuner(trials=2, probe_every=4)
    for _ in range(10):
        pick = tuner.choose(1, may_probe=False)
        assert pick is False                                 # quiet first
        tuner.observe(1, pick, 1.0)
    assert tuner.choose(1, may_probe=True) is True           # its first probe, once allowed
    assert tuner.probing(1)


def test_quiet_replays_come_first_and_predicting_ones_are_tried() -> None:
    # Each step size starts on the quiet recording and tries the predicting one after its first trials.
    tuner = PredictTuner(trials=3, probe_every=8)
    picks = run(tuner, 4, lambda p: 1.0, 12)
    assert picks[:4] == [False] * 4 and picks[4:7] == [True] * 3
    assert tuner.state()[4][0] is False                      # no faster by the margin: quiet stays


def fake_direct(share_tuner: ShareTuner, quota: int = 1) -> ReplayChooser:
    """A ReplayChooser over a direct path whose claims are open (``quota`` > 0) and whose CPU share is
    tuned (``auto`` on a GPU) by a real GraphCpuShares: the quiet recording's tuner is ``share_tuner``,
    the predicting one's is made alike."""
    r = SimpleNamespace(device=torch.device("cpu"), cold=SimpleNamespace(mode="auto", rates=None))
    shares = GraphCpuShares(r, hidden=8)
    shares.tuners = {False: share_tuner, True: ShareTuner(trials=share_tuner.trials, probe_every=share_tuner.probe_every)}
    path = SimpleNamespace(claims=SimpleNamespace(quota=lambda tokens: quota, open_for=lambda tokens: quota > 0),
                           direct_for=lambda tokens: True, shares=shares, cpu_share_on=True, r=r)
    d = ReplayChooser(path)
    d.predict_tuner = PredictTuner(trials=3, probe_every=12)
    return d


def step(d, seconds) -> tuple[bool, float]:
    """One replayed step as DecodeGraphs.run drives it: ``predicts``, the replay's start (the choice
    taken, the share chosen), then its time observed; ``seconds(pick, share)``."""
    pick = d.predicts(1)
    d.take(pick, 1)
    share = d.path.shares.share_for(1)
    d.observe(1, seconds(pick, share), shared=True)
    return pick, share


def test_the_recording_and_the_cpu_share_are_tuned_on_separate_steps() -> None:
    # Step time: quiet replays are 20% faster, and a CPU share of 4/8 beats the others. Both tuners
    # find their best, and no step is measured by both while either tries something other than
    # what it has in force (a probe of one would otherwise read as the other's time).
    share_tuner = ShareTuner(trials=3, probe_every=10)
    d = fake_direct(share_tuner)
    both = 0
    for _ in range(500):
        pick = d.predicts(1)
        d.take(pick, 1)
        share = d.path.shares.share_for(1)
        both += d.predict_tuner.probing(1) and share_tuner.probing(1) and not d._measured[3]
        d.observe(1, (1.2 if pick else 1.0) * (1.0 + abs(share - 0.5)), shared=True)
    assert both == 0
    assert d.predict_tuner.state()[1][0] is False
    assert share_tuner.state()[1][0] == 0.5
    assert d.predicting_state() == ((1, False),)


def test_a_recording_made_in_the_middle_of_a_probe_stalls_neither_tuner() -> None:
    # The graphs are recorded again (a new bucket, a reset) while the predicting recording is being
    # probed: the share tuner's next step is not a measure and the probe is dropped, so both go on;
    # afterwards predicting (faster here) is found and kept.
    share_tuner = ShareTuner(trials=2, probe_every=10)
    d = fake_direct(share_tuner)
    seconds = lambda pick, share: (1.0 if pick else 1.5) * (1.0 + abs(share - 0.5))   # noqa: E731
    while not d.predict_tuner.probing(1):
        step(d, seconds)
    share_tuner.recorded()
    d.predict_tuner.recorded()
    for _ in range(300):
        step(d, seconds)
    assert d.predict_tuner.state()[1][0] is True and share_tuner.state()[1][0] == 0.5


def test_a_share_suggestion_is_a_probe_the_recordings_tuner_does_not_measure() -> None:
    # The cost model suggests a share far from the one in force: the step that tries it is the share
    # tuner's probe, and the recordings' tuner learns nothing from it.
    share_tuner = ShareTuner(trials=2, probe_every=1000)
    d = fake_direct(share_tuner)
    d.predict_tuner = PredictTuner(trials=3, probe_every=1000)     # no probe of predicting after the first
    for _ in range(60):
        step(d, lambda pick, share: 1.0 + share)         # the bus alone is fastest
    assert share_tuner.state()[1][0] == 0.0
    d.path.shares.balanced = lambda: 0.75
    tuner_samples = sum(len(v) for v in d.predict_tuner._s[1]["recent"].values())
    pick = d.predicts(1)
    d.take(pick, 1)
    assert share_tuner.probing(1) and d._measured[3] is True     # the share's probe: not the recordings'
    d.observe(1, 9.0, shared=True)
    assert sum(len(v) for v in d.predict_tuner._s[1]["recent"].values()) == tuner_samples


def test_a_step_whose_claims_are_closed_replays_quiet_and_measures_only_the_share() -> None:
    share_tuner = ShareTuner(trials=2, probe_every=10)
    d = fake_direct(share_tuner, quota=0)
    for _ in range(30):
        pick, _ = step(d, lambda pick, share: 1.0 + abs(share - 0.5))
        assert pick is False
    assert d.predict_tuner.state() == {}
    assert share_tuner.state()[1][0] == 0.5


def test_a_probe_step_of_closed_claims_predicts_and_is_not_a_measure() -> None:
    # The claims are closed but this is one of the claim gate's probe steps: the step predicts (so the
    # gate measures its claims again) whatever the tuner has in force, and the tuner learns nothing from it.
    d = fake_direct(ShareTuner(trials=2, probe_every=10))
    d.path.claims.open_for = lambda tokens: False
    for _ in range(5):
        step(d, lambda pick, share: 1.0)
    assert d.predict_tuner.state() == {}
    assert all(not tried for t in d.path.shares.tuners.values() for _, tried in t.state().values())   # no share timed


def test_no_suggested_share_starts_while_a_probe_of_the_other_recording_runs() -> None:
    share_tuner = ShareTuner(trials=2, probe_every=10)
    d = fake_direct(share_tuner)
    seconds = lambda pick, share: 1.0 + abs(share - 0.5)   # noqa: E731
    # a probe of predicting whose share was found (its first steps find it, and hold nothing)
    while not d.predict_tuner.probing(1) or d.path.shares.tuners[True].probing(1):
        step(d, seconds)
    d.take(d.predicts(1))
    assert d.path.shares.hold is True
    d.path.claims.quota = lambda tokens: 0                 # closed from now on: quiet, and nothing held
    assert d.predicts(1) is False
    d.take(False)
    assert d.path.shares.hold is False


def test_each_recording_is_measured_at_the_cpu_share_tuned_for_it() -> None:
    # Quiet steps are fastest with half the missing experts on the CPU (1.2), predicting ones with
    # none (1.0: their copies ahead leave the bus free), and predicting at half is slower (1.5) than
    # quiet. One share for both would have tried predicting at quiet's share, found it slower and
    # kept quiet; with a share tuner per recording, the probe of predicting first finds its own share,
    # then wins, and a later probe of quiet runs at quiet's share.
    d = fake_direct(ShareTuner(trials=3, probe_every=10))
    seconds = lambda pick, share: 1.0 + share if pick else 1.2 + abs(share - 0.5)   # noqa: E731
    quiet_shares = []
    for i in range(300):
        pick, share = step(d, seconds)
        if i > 100 and not pick:
            quiet_shares.append(share)
    assert d.predicting_state() == ((1, True),)
    assert d.path.shares.tuners[True].state()[1][0] == 0.0 and d.path.shares.tuners[False].state()[1][0] == 0.5
    assert quiet_shares and set(quiet_shares) == {0.5}          # probes of quiet, at its own share
    assert d.cpu_shares_in_force() == ((1, 0.0),)    # the share of the recording in force


def test_the_share_reported_is_that_of_the_recording_the_size_replays_now() -> None:
    # Predicting wins at one token; then the claims close, so the steps replay quiet at quiet's own
    # share: the stats say that share, not the one tuned for predicting.
    d = fake_direct(ShareTuner(trials=3, probe_every=10))
    seconds = lambda pick, share: 1.0 + share if pick else 1.2 + abs(share - 0.5)   # noqa: E731
    for _ in range(120):
        step(d, seconds)
    assert d.cpu_shares_in_force() == ((1, 0.0),)
    d.path.claims.quota = lambda tokens: 0
    for _ in range(3):
        assert step(d, seconds)[0] is False
    assert d.cpu_shares_in_force() == ((1, 0.5),)


def test_a_probe_far_slower_than_the_recording_in_force_ends_while_its_share_is_found() -> None:
    # Predicting takes three times as long: its first step at the share its tuner starts from (the
    # one after the recording is not a measure) ends the probe as a failed one, and quiet stays in force.
    d = fake_direct(ShareTuner(trials=3, probe_every=10))
    picks = [step(d, lambda pick, share: 3.0 if pick else 1.0)[0] for _ in range(40)]
    first = picks.index(True)
    assert picks[first:first + 12] == [True, True] + [False] * 10
    assert d.predicting_state() == ((1, False),)


def test_a_slow_share_tried_while_a_probes_share_is_found_does_not_end_the_probe() -> None:
    # The probed recording's share tuner tries the bus alone (share 0), far slower: that says nothing
    # of the recording, so the first probe goes on and, at its own share, predicting wins (ending it
    # there would have waited for the next probe, ten steps on).
    d = fake_direct(ShareTuner(trials=3, probe_every=10))
    seconds = lambda pick, share: (0.8 if pick else 1.0) * (1.0 + 2 * abs(share - 0.5))   # noqa: E731
    for _ in range(20):
        step(d, seconds)
    assert d.predicting_state() == ((1, True),)


def test_one_share_tuner_for_both_recordings_when_asked() -> None:
    r = SimpleNamespace(device=torch.device("cpu"), cold=SimpleNamespace(mode="auto", rates=None))
    one = GraphCpuShares(r, hidden=8, per_recording=False)
    assert one.tuners[False] is one.tuners[True]
    one.set_per_recording(True)
    assert one.tuners[False] is not one.tuners[True]
