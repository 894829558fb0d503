"""A fixed-seed serving workload: how many requests, how long, how many at once, and the prompts.

Everything a run sends is drawn from the seed: the same workload gives the same prompts, the same
output lengths and the same arrival times in-process and through HTTP, on any machine. Prompts are
token ids, so they work for a model without a tokenizer and for any server that takes token-id
prompts (Strata, vLLM, llama-server); ``text_prompts`` sends random words instead, for servers that
take text only.

Lengths are written as on the command line: ``128`` (fixed), ``96:160`` (uniform, both ends
included) or ``128~16`` (normal with mean 128 and standard deviation 16, clipped to mean +- 3 sd
and to at least 1).
"""
from __future__ import annotations

import dataclasses
import random
import re
from dataclasses import dataclass
from typing import Protocol

from engine.errors import ConfigError

ID_LOW = 10                 # the first ids of most vocabularies are special (pad, bos, eos, unk)
ID_HIGH = 32000             # the smallest vocabulary of the supported families: ids below it are plain tokens
DEFAULT_SEED = 0

# Words of random text prompts: short, common, one or two tokens in every English vocabulary.
WORDS = tuple("""the of and to in is was for on that with as by at from his her an were are which this be
or has had not but have one they you all new more first two their time who its can after may so over
year other some when into only most also many about then these would than like long well people
city made way world life part state day work water house place small back light sound point room
river stone field road music story window garden morning evening summer winter market letter paper
train bridge island forest mountain valley ocean cloud lake table chair kitchen doctor teacher""".split())


class Length(Protocol):
    """A distribution of token counts."""

    def sample(self, rng: random.Random) -> int: ...

    @property
    def largest(self) -> int: ...


@dataclass(frozen=True)
class Fixed:
    n: int

    def __post_init__(self) -> None:
        _positive("a length", self.n)

    def sample(self, rng: random.Random) -> int:
        return self.n

    @property
    def largest(self) -> int:
        return self.n

    def __str__(self) -> str:
        return str(self.n)


@dataclass(frozen=True)
class Uniform:
    low: int
    high: int

    def __post_init__(self) -> None:
        _positive("a length range's low end", self.low)
        if self.high < self.low:
            raise ConfigError(f"the length range {self.low}:{self.high} ends below its start; write LOW:HIGH, e.g. 96:160")

    def sample(self, rng: random.Random) -> int:
        return rng.randint(self.low, self.high)

    @property
    def largest(self) -> int:
        return self.high

    def __str__(self) -> str:
        return f"{self.low}:{self.high}"


@dataclass(frozen=True)
class Normal:
    mean: int
    std: int

    def __post_init__(self) -> None:
        _positive("a length's mean", self.mean)
        if self.std < 0:
            raise ConfigError(f"the length {self.mean}~{self.std} has a negative spread; write MEAN~SD, e.g. 128~16")

    def sample(self, rng: random.Random) -> int:
        low, high = max(1, self.mean - 3 * self.std), self.mean + 3 * self.std
        return min(high, max(low, round(rng.gauss(self.mean, self.std))))

    @property
    def largest(self) -> int:
        return self.mean + 3 * self.std

    def __str__(self) -> str:
        return f"{self.mean}~{self.std}"


def _positive(what: str, n: object) -> None:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ConfigError(f"{what} must be a whole number >= 1 (got {n!r})")


_LENGTH = re.compile(r"^\s*(\d+)\s*(?:([:~])\s*(\d+))?\s*$")


def parse_length(text: str, flag: str = "length") -> Length:
    """``"128"``, ``"96:160"`` or ``"128~16"`` as a length distribution; a ConfigError naming ``flag`` else."""
    m = _LENGTH.match(str(text))
    if not m:
        raise ConfigError(f"{flag} {text!r} is not a length; write N (fixed), LOW:HIGH (uniform) or MEAN~SD "
                          "(normal), e.g. 128, 96:160 or 128~16")
    a, sep, b = m.group(1), m.group(2), m.group(3)
    try:
        if sep is None:
            return Fixed(int(a))
        return Uniform(int(a), int(b)) if sep == ":" else Normal(int(a), int(b))
    except ConfigError as e:           # the length's own check: said of the flag that gave it
        raise ConfigError(f"{flag} {text.strip()}: {e}") from None


@dataclass(frozen=True)
class BenchRequest:
    """One request of a workload: what to send and when."""

    index: int
    prompt: tuple[int, ...] | str         # token ids, or text with ``text_prompts``
    prompt_len: int                       # tokens drawn for the prompt (words for a text prompt)
    output_len: int                       # max_tokens; with EOS ignored, exactly the tokens generated
    arrival_s: float                      # seconds after the start at which it may be sent (0: at once)


@dataclass(frozen=True)
class Workload:
    """What ``bench`` sends. ``concurrency`` caps the requests in flight (a closed loop when no rate
    is given); ``request_rate`` (requests per second) sends them at Poisson arrival times (an open loop,
    still capped by ``concurrency`` when both are set)."""

    num_requests: int = 32
    prompt_len: Length = Fixed(128)
    output_len: Length = Fixed(128)
    concurrency: int | None = 8
    request_rate: float | None = None
    seed: int = DEFAULT_SEED
    temperature: float = 0.0
    ignore_eos: bool = True
    text_prompts: bool = False
    name: str = "custom"

    def __post_init__(self) -> None:
        _positive("--requests", self.num_requests)
        if self.concurrency is not None:
            _positive("--concurrency", self.concurrency)
        if self.request_rate is not None and not (isinstance(self.request_rate, (int, float))
                                                  and 0 < self.request_rate < float("inf")):
            raise ConfigError(f"--request-rate must be a number of requests per second > 0 (got {self.request_rate!r})")
        if self.concurrency is None and self.request_rate is None:
            raise ConfigError("the workload needs --concurrency or --request-rate (or both)")
        if not isinstance(self.temperature, (int, float)) or not 0 <= self.temperature < float("inf"):
            raise ConfigError(f"--temperature must be a number >= 0 (got {self.temperature!r}); 0 is greedy")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed < 2 ** 32:
            raise ConfigError(f"--seed must be a whole number from 0 to {2 ** 32 - 1} (got {self.seed!r})")

    def replace(self, **changes) -> Workload:
        return dataclasses.replace(self, **changes)

    @property
    def longest(self) -> int:
        """The most tokens one request can need: longest prompt plus longest reply."""
        return self.prompt_len.largest + self.output_len.largest

    def requests(self, vocab_size: int = ID_HIGH, avoid: frozenset[int] = frozenset()) -> list[BenchRequest]:
        """The requests, drawn from the seed alone. Prompt ids come from ``[10, min(vocab_size, 32000))``,
        so a model and a server of the same vocabulary get the same prompts; an id in ``avoid`` (the
        model's special ids) becomes the next id that is not."""
        high = min(vocab_size, ID_HIGH)
        if high - ID_LOW - sum(1 for t in avoid if ID_LOW <= t < high) < 1:
            raise ConfigError(f"a vocabulary of {vocab_size} tokens leaves no plain token ids to draw prompts from; "
                              "use --text-prompts")
        lengths = random.Random(f"{self.seed}-lengths")
        prompts = random.Random(f"{self.seed}-prompts")
        arrivals = random.Random(f"{self.seed}-arrivals")
        out, t = [], 0.0
        for i in range(self.num_requests):
            p, o = self.prompt_len.sample(lengths), self.output_len.sample(lengths)
            if self.text_prompts:
                prompt: tuple[int, ...] | str = " ".join(prompts.choice(WORDS) for _ in range(p))
            else:
                prompt = tuple(_plain(prompts.randrange(ID_LOW, high), avoid, high) for _ in range(p))
            if self.request_rate is not None and i > 0:
                t += arrivals.expovariate(self.request_rate)
            out.append(BenchRequest(i, prompt, p, o, t))
        return out

    def describe(self) -> dict:
        """The workload as plain JSON values (lengths in their command-line form)."""
        return {"name": self.name, "num_requests": self.num_requests, "prompt_len": str(self.prompt_len),
                "output_len": str(self.output_len), "concurrency": self.concurrency,
                "request_rate": self.request_rate, "seed": self.seed, "temperature": self.temperature,
                "ignore_eos": self.ignore_eos, "text_prompts": self.text_prompts}

    def summary(self) -> str:
        """One line: what runs."""
        load = [f"concurrency {self.concurrency}"] if self.concurrency else []
        load += [f"{self.request_rate:g} req/s (Poisson)"] if self.request_rate else []
        return (f"{self.num_requests} requests, prompt {self.prompt_len}, output {self.output_len}, "
                f"{', '.join(load)}, seed {self.seed}" + ("" if self.ignore_eos else ", stopping at EOS"))


def request_seed(workload: Workload, req: BenchRequest) -> int:
    """The sampling seed of one request, sent alike in-process and over HTTP."""
    return workload.seed * 100_003 + req.index


def _plain(token: int, avoid: frozenset[int], high: int) -> int:
    while token in avoid:
        token = ID_LOW + (token + 1 - ID_LOW) % (high - ID_LOW)
    return token


def fit_preset_output(workload: Workload, context_tokens: int, model: str) -> tuple[Workload, str | None]:
    """A preset whose replies would run past ``model``'s context, with replies shortened to fit it (the
    prompts as they are) and a note saying so; any other workload as it is, with None."""
    room = context_tokens - workload.prompt_len.largest
    if workload.longest <= context_tokens or room < 1 or not isinstance(workload.output_len, Fixed):
        return workload, None
    preset = workload.name.removesuffix(" (changed)")
    note = (f"{preset}: replies of {room} tokens instead of {workload.output_len.n}, to fit the "
            f"{context_tokens}-token context of {model}; give --output-len to choose")
    return workload.replace(output_len=Fixed(room), name=f"{preset} (changed)"), note


# The source articles' workloads. offload-batch: many requests of similar length at max batch 16;
# four-streams: four concurrent streams of ~600-word answers (about 800 tokens) to short prompts.
PRESETS: dict[str, Workload] = {
    "offload-batch": Workload(num_requests=64, prompt_len=Normal(128, 16), output_len=Fixed(256), concurrency=16,
                              name="offload-batch"),
    "four-streams": Workload(num_requests=4, prompt_len=Normal(40, 4), output_len=Fixed(800), concurrency=4,
                             name="four-streams"),
}
