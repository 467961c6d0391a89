"""`/metrics` for the remote MCP servers requests name: requests, errors and latency by server label.

Fed by the edge's MCP rounds (edge/mcp_rounds.py) as each listing (`tools/list`) and call (`tools/call`)
ends, whichever API asked for it. A server label is the client's word (a Responses `server_label`, a
Messages server `name`), so the labels one registry keeps are capped: past the cap a new label is counted
under `other`, and a client cannot grow the scrape without bound.
"""

from __future__ import annotations

import attrs
from prometheus_client import CollectorRegistry, Counter, Histogram

# Distinct server labels kept as series; any later one is counted as `other`.
LABELS_MAX = 64
OTHER = "other"
_LABELS = ("server_label", "method")
# A call's seconds run from a local server's milliseconds to the call timeout (edge/mcp_tools.py's 30 s).
_SECONDS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0)


@attrs.define
class McpMeter:
    """The MCP series of one app's registry."""

    registry: CollectorRegistry
    _requests: Counter = attrs.field(init=False)
    _errors: Counter = attrs.field(init=False)
    _seconds: Histogram = attrs.field(init=False)
    _seen: set[str] = attrs.field(factory=set, init=False)

    def __attrs_post_init__(self) -> None:
        self._requests = Counter(
            "mlx_relay:mcp_requests",
            "Requests to remote MCP servers, by server and method",
            _LABELS,
            registry=self.registry,
        )
        self._errors = Counter(
            "mlx_relay:mcp_request_errors",
            "MCP requests that failed: unreachable, timed out, refused, or a tool's own error",
            _LABELS,
            registry=self.registry,
        )
        self._seconds = Histogram(
            "mlx_relay:mcp_request_seconds",
            "Seconds from connecting to an MCP server to its answer",
            _LABELS,
            buckets=_SECONDS,
            registry=self.registry,
        )

    def observe(self, server_label: str, method: str, *, seconds: float, failed: bool) -> None:
        """One finished MCP request: `method` is MCP's own name for it (`tools/list`, `tools/call`)."""
        label = self._label(server_label)
        self._requests.labels(label, method).inc()
        self._seconds.labels(label, method).observe(seconds)
        if failed:
            self._errors.labels(label, method).inc()

    def _label(self, server_label: str) -> str:
        if server_label in self._seen:
            return server_label
        if len(self._seen) >= LABELS_MAX:
            return OTHER
        self._seen.add(server_label)
        return server_label
