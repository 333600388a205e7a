"""A streamed completion timed as a load generator times it; shared by the serving benchmarks.

Apart from `_common` on purpose: importing `_common` sets ``SPECPREFILL_COMPILE=0`` for the process
and every server it starts, and the GPU serving benchmark measures the default (compiled) path.
"""

from __future__ import annotations

import json
import time
from typing import Any


def stream_completion(http: Any, url: str, body: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    """POST ``body`` as a streamed completion on the httpx client ``http``: (client TTFT in ms, the usage).

    The clock starts at the request, the client already built. The first token is the first chunk
    with choices, even one whose text waits for the rest of a character, as load generators time it.

    Raises:
        RuntimeError: a status other than 200, or a stream without a first token or usage.
    """
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    ttft, usage = None, None
    t0 = time.perf_counter()
    with http.stream("POST", url, json=body) as response:
        if response.status_code != 200:
            raise RuntimeError(f"{url}: stream status {response.status_code}: {response.read()[:500]!r}")
        for line in response.iter_lines():
            if not line.startswith("data: {"):
                continue
            event = json.loads(line[6:])
            if ttft is None and event.get("choices"):
                ttft = (time.perf_counter() - t0) * 1000
            usage = event.get("usage") or usage
    if ttft is None or not usage:
        raise RuntimeError(f"{url}: a stream without a first token or usage")
    return ttft, usage
