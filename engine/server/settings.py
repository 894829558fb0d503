"""How the HTTP server runs: address, key, limits; and the rule that an open bind needs a key."""
from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from engine.errors import ConfigError

MIB = 1 << 20


@dataclass(frozen=True)
class ServerSettings:
    """Settings of one OpenAI-compatible server.

    ``max_queued``: requests that may wait beyond what the engine runs at once. The server counts the
    engine requests it has submitted and not seen finish (one per prompt and choice); those beyond the
    engine's ``max_batch`` are waiting, and a request that would make more than ``max_queued`` wait is
    answered 503 with ``Retry-After``.
    """

    host: str = "127.0.0.1"
    port: int = 8000                      # 0 = any free port (the URL names the one chosen)
    api_key: str | None = None
    served_model_name: str | None = None  # None: the model folder's name
    max_queued: int = 256
    max_body_bytes: int = 8 * MIB
    stats_every: int = 100                # engine steps between [Stats] log lines; 0 = off
    allow_no_key: bool = False            # serve a non-loopback address without a key, on purpose

    def __post_init__(self) -> None:
        if not isinstance(self.host, str) or not self.host.strip():
            raise ConfigError(f"host must be an address such as 127.0.0.1 (got {self.host!r})")
        _whole("port", self.port, 0, 65535)
        _whole("max_queued", self.max_queued, 0)
        _whole("max_body_bytes", self.max_body_bytes, 1024)
        _whole("stats_every", self.stats_every, 0)
        if self.api_key is not None and (not isinstance(self.api_key, str) or not self.api_key.strip()):
            raise ConfigError("the API key is empty; give a non-empty --api-key KEY, or leave it out")
        if self.served_model_name is not None and (not isinstance(self.served_model_name, str)
                                                   or not self.served_model_name.strip()):
            raise ConfigError("the served model name is empty; give a name or leave --served-model-name out")


def _whole(name: str, value: object, minimum: int, maximum: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum or (maximum is not None
                                                                                   and value > maximum):
        bound = f"from {minimum} to {maximum}" if maximum is not None else f">= {minimum}"
        raise ConfigError(f"{name} must be a whole number {bound} (got {value!r})")


def is_loopback(host: str) -> bool:
    """Whether ``host`` only accepts connections from this machine."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip().strip("[]")).is_loopback
    except ValueError:
        return False            # a host name may resolve to anything: treat it as open


def check_bind(host: str, api_key: str | None, allow_no_key: bool) -> None:
    """Refuse to serve a non-loopback address without an API key, unless that was asked for explicitly."""
    if api_key or allow_no_key or is_loopback(host):
        return
    raise ConfigError(f"refusing to serve on {host} without an API key; give --api-key KEY (or STRATA_API_KEY), "
                      "or --no-api-key to serve it open")
