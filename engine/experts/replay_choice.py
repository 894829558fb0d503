"""``ReplayChooser``: which recording a replayed direct-read decode step runs, and what its time measures.

A direct-read decode step is recorded twice (engine/cuda_graphs.py): predicting (each layer routes the
hidden state through later layers' routers and the GPU copies the guessed experts in ahead,
engine/experts/claims.py) and ``quiet`` (no predictions, no claims). Before each replay the chooser
picks one (:meth:`predicts`); as it starts, the pick becomes what the step's time measures
(:meth:`take`); once it ran, the time goes to the tuners it measures (:meth:`observe`):

* :class:`engine.experts.predict_tuner.PredictTuner`, which of the two recordings is faster for each
  step size;
* the CPU share's :class:`engine.experts.cold_graph.ShareTuner` of the recording that replayed (one per
  recording, held by :class:`engine.experts.cold_graph.GraphCpuShares`), where the host CPU takes a
  share of each layer's missing experts under ``cold_experts`` auto.

Each tuner counts only the steps on which the other measures nothing, so that neither reads the other's
probe as its own; the claim gate's probe steps count for neither.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from engine.experts.predict_tuner import PredictTuner

if TYPE_CHECKING:
    from engine.experts.direct import DirectPath


class ReplayChoice(NamedTuple):
    """What :meth:`ReplayChooser.predicts` chose for one replayed step, and what its time may measure."""
    tokens: int
    predicting: bool          # the predicting recording replays (else the quiet one)
    probe: bool               # a probe of the recording not in force: no measure for the CPU share's tuner
    share_busy: bool          # the CPU share's tuner measures this step: no measure for the recordings' tuner
    warming: bool = False     # a probe's step that finds the probed recording's share, at its start share


class ReplayChooser:
    """The choice of recording for the replayed steps of one direct path (``path``: its claims, its
    CPU shares once recorded, which steps read directly)."""

    def __init__(self, path: "DirectPath") -> None:
        self.path = path
        self.predict_tuner = PredictTuner()          # predicting or quiet replays, per step size
        self._chose: ReplayChoice | None = None      # what ``predicts`` chose for the step about to replay
        self._measured: ReplayChoice | None = None   # ... for the step replayed last, until observed
        self.replayed: bool | None = None            # whether the step replayed last was the predicting recording
        self.replayed_recording: dict[int, bool] = {}  # step size -> its last replay outside a probe predicted

    def predicts(self, tokens: int) -> bool:
        """Whether this replayed step should predict later layers' experts (else the decode graph
        recorded without predictions replays: ``quiet``, no router GEMMs and routing for later layers,
        no claim or copy launches). Not when the GPU-side prefetch may claim nothing this step (its
        guesses were mostly wrong and this is not a probe step): the predictions would feed nothing
        but statistics (measured on the H200, Qwen3-30B-A3B shape, bf16, batch 1: those launches take
        about 0.9 ms a step). Always on the claim gate's probe steps of closed claims, which measure
        them again. Otherwise whichever recording the step times say is faster for this step size
        (:class:`engine.experts.predict_tuner.PredictTuner`), measured while the CPU share's tuner is
        not measuring the same steps. Each recording has a share tuner of its own: a probe of the other
        recording runs at that one's share, and where that share was never tuned, the probe's first
        steps tune it (they measure the share, not the recording)."""
        self._chose = None
        path, shares = self.path, self.path.shares
        if path.claims is None or not path.direct_for(tokens):
            return True
        if path.claims.quota(tokens) == 0:
            return False
        if not path.claims.open_for(tokens):
            # the claim gate's probe: it measures the claims, not the step, so neither tuner counts it
            self._chose = ReplayChoice(tokens, True, probe=True, share_busy=True)
            return True
        tuner, share_busy, tuned = self.predict_tuner, False, self.share_tuned()
        if tuned:
            # the recording in force's share tuner: whether it measures decides whether a probe may start
            shares.select(tuner.in_force(tokens))
            if not tuner.probing(tokens):
                shares.suggest(tokens)        # a share the cost model suggests starts now, or waits
            share_busy = shares.tuner.probing(tokens)
            if share_busy and tuner.probing(tokens):
                tuner.cancel(tokens)          # e.g. a recording made mid-probe: it starts again when free
        pick = tuner.choose(tokens, may_probe=not share_busy)
        probe = tuner.probing(tokens)
        warming = probe and tuned and shares.tuners[pick].probing(tokens)
        if warming:
            probe, share_busy = False, True   # the probed recording's share is still being found
            # a step at the share it starts from also says how fast the recording is (one far slower
            # than the recording in force ends the probe); one trying another share says nothing of it
            warming = shares.tuners[pick].measuring_in_force(tokens)
        self._chose = ReplayChoice(tokens, pick, probe, share_busy, warming)
        return pick

    def take(self, predicting: bool, tokens: int | None = None) -> None:
        """As a replay of the ``predicting`` recording (or the quiet one) of ``tokens`` tokens starts:
        what ``predicts`` chose for it becomes what its time measures (None: it was not asked), the CPU
        share and its tuner are that recording's, and no suggested share starts while a probe of the
        other recording runs."""
        self._measured, self._chose = self._chose, None
        self.replayed = bool(predicting)
        m = self._measured
        if tokens is not None and (m is None or not (m.probe or m.warming)):
            self.replayed_recording[tokens] = self.replayed
        shares = self.path.shares
        if shares is not None:
            shares.select(predicting)
            shares.hold = m is not None and m.probe

    def share_tuned(self) -> bool:
        """Whether replayed steps' CPU share is tuned by measuring them (``auto`` on a GPU)."""
        path = self.path
        return path.shares is not None and path.cpu_share_on and path.r.cold.mode == "auto"

    def observe(self, tokens: int, seconds: float, shared: bool) -> None:
        """A replayed direct-read step of ``tokens`` tokens took ``seconds``: to the tuner of its
        recording (when ``predicts`` chose it) and, ``shared``, the CPU share's. Each tuner counts only
        the steps in which the other measured nothing."""
        chose, self._measured = self._measured, None
        if chose is not None and chose.tokens != tokens:
            chose = None
        if chose is not None and (not chose.share_busy
                                  or chose.warming and self.predict_tuner.too_slow(tokens, seconds)):
            # a warming step far slower than the recording in force ends the probe as a failed one
            self.predict_tuner.observe(tokens, chose.predicting, seconds)
        shares = self.path.shares
        if shared and shares is not None and not (chose is not None and chose.probe):
            shares.observe(tokens, seconds)   # the tuner ``take`` selected for this replay

    def predicting_state(self) -> tuple[tuple[int, bool], ...]:
        """(tokens, whether replayed steps of that size predict) for each size whose two recordings
        have both been measured (while the claims are open: closed ones replay quiet whatever this says)."""
        return tuple((t, on) for t, (on, times) in self.predict_tuner.state().items() if len(times) == 2)

    def cpu_shares_in_force(self) -> tuple[tuple[int, float], ...]:
        """(tokens, CPU share) per replayed step size: the share of the recording that size replayed last
        outside a probe (the claims may have closed since the recordings' tuner chose; a size it never
        saw counts as quiet)."""
        shares = self.path.shares
        if shares is None:
            return ()
        return shares.in_force(lambda tokens: self.replayed_recording.get(tokens, False))

    def reset(self) -> None:
        """A live change: the last setting's step times say nothing of the next (either tuner's)."""
        self.predict_tuner.reset()
        if self.path.shares is not None:
            self.path.shares.reset()
