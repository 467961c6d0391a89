"""OpenTelemetry traces (the `otel` extra), on when `OTEL_EXPORTER_OTLP_ENDPOINT` is set.

One span per generation request, `POST <route>`, with a child span per
stage it passed through: `prepare` (parse, template, tokenize, grammar),
`queue` (waiting for a batch row), `prefill` and `decode`. A client's (or a
router's) `traceparent` header is honoured, so the request's span joins
its trace. The span carries our trace id (`x-request-id`) as
`mlx_relay.trace_id`.

The spans are made when the request leaves the batch, from the sink's
timeline (`pipeline/observe.py`), so streaming and non-streaming requests
alike get theirs without a span held open across the stream: the route
registers the request's parent context when it submits, the observer
turns the record's spans into timestamps back from now. A request refused
before the batch (a 400, a 429) gets no span. The exporter is OTLP over
HTTP, configured by the standard `OTEL_*` variables.
"""

from __future__ import annotations

import collections
import os
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import attrs
import structlog

from pipeline.observe import RequestRecord

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.sdk.trace import TracerProvider

log = structlog.get_logger(stage="telemetry")

# Requests whose parent context waits for their record; bounded, so a
# request that never reaches the sink cannot grow it without end.
_PENDING = 4096


@attrs.frozen
class _Pending:
    route: str
    trace_id: str
    context: Context


@attrs.define
class Tracing:
    provider: TracerProvider
    _pending: collections.OrderedDict[str, _Pending] = attrs.field(factory=collections.OrderedDict, init=False)

    def submitted(self, request_id: str, *, route: str, trace_id: str, headers: Mapping[str, str]) -> None:
        """Remember the request's parent (its `traceparent`, if any) until it finishes."""
        from opentelemetry.propagate import extract

        # Lower-case names: the propagators look up `traceparent` exactly.
        carrier = {name.lower(): value for name, value in headers.items()}
        self._pending[request_id] = _Pending(route, trace_id, extract(carrier))
        while len(self._pending) > _PENDING:
            self._pending.popitem(last=False)

    def forget(self, request_id: str) -> None:
        self._pending.pop(request_id, None)

    def token_gap(self, seconds: float) -> None:
        pass

    def finished(self, record: RequestRecord) -> None:
        pending = self._pending.pop(record.request_id, None)
        if pending is None:
            return
        from opentelemetry.trace import SpanKind

        tracer = self.provider.get_tracer("mlx-relay")
        end = time.time_ns()
        total = _ns(record.total) or sum(_ns(s) for s in (record.queue, record.prefill, record.decode))
        start = end - total
        attributes: dict[str, Any] = {
            "mlx_relay.request_id": record.request_id,
            "mlx_relay.trace_id": pending.trace_id,
            "mlx_relay.finish_reason": record.finish_reason,
            "gen_ai.usage.input_tokens": record.prompt_tokens,
            "gen_ai.usage.output_tokens": record.completion_tokens,
            "mlx_relay.cached_tokens": record.cached_tokens,
        }
        span = tracer.start_span(
            f"POST {pending.route}",
            context=pending.context,
            kind=SpanKind.SERVER,
            start_time=start,
            attributes=attributes,
        )
        from opentelemetry.trace import set_span_in_context

        inside = set_span_in_context(span)
        stages = [
            (name, _ns(value))
            for name, value in (("queue", record.queue), ("prefill", record.prefill), ("decode", record.decode))
        ]
        at = end - sum(duration for _, duration in stages)
        tracer.start_span("prepare", context=inside, start_time=start).end(end_time=max(start, at))
        for name, duration in stages:
            if duration:
                tracer.start_span(name, context=inside, start_time=at).end(end_time=at + duration)
                at += duration
        span.end(end_time=end)

    def shutdown(self) -> None:
        self.provider.shutdown()


def _ns(seconds: float | None) -> int:
    return int(seconds * 1e9) if seconds is not None else 0


def configure_tracing(environ: Mapping[str, str] | None = None) -> Tracing | None:
    """Tracing when the OTLP endpoint is set and the `otel` extra is installed; else None."""
    env = os.environ if environ is None else environ
    if not (env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")):
        return None
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        log.warning(
            "telemetry.unavailable", reason="OTEL_EXPORTER_OTLP_ENDPOINT is set but the otel extra is not installed"
        )
        return None
    provider = TracerProvider(resource=Resource.create({"service.name": env.get("OTEL_SERVICE_NAME", "mlx-relay")}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    return Tracing(provider)
