"""`HttpLimits`: what one client may cost the serving front end (`rose.runtime.coserve.http`)."""
from __future__ import annotations

import math
from dataclasses import dataclass

from rose.errors import config_check

MAX_BODY_BYTES = 1 << 20  # larger request bodies are refused (413)


@dataclass(frozen=True)
class HttpLimits:
    """What one client may cost the front end. The defaults suit online traffic; tests shorten them."""

    max_body_bytes: int = MAX_BODY_BYTES  # larger request bodies are refused (413)
    body_timeout_s: float = 10.0  # a body not fully received in this long is refused (408), s
    # A connection with no complete request (headers) for this long is closed (aiohttp's keepalive
    # timeout, which it also arms from the moment a connection opens), s.
    idle_timeout_s: float = 15.0
    write_timeout_s: float = 30.0  # a streaming client that reads nothing for this long is dropped, s

    def __post_init__(self):
        c = "HttpLimits"
        config_check(isinstance(self.max_body_bytes, int) and self.max_body_bytes > 0, c, "max_body_bytes",
                     self.max_body_bytes, "an int > 0")
        for name in ("body_timeout_s", "idle_timeout_s", "write_timeout_s"):
            v = getattr(self, name)
            config_check(isinstance(v, (int, float)) and math.isfinite(v) and v > 0, c, name, v, "> 0 (seconds)")
