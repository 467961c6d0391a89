"""`GET /metrics`: Prometheus metrics under vLLM's names, and ours under `mlx_relay:`.

Routers and dashboards already read vLLM's names: smg scrapes
`vllm:num_requests_running`, `vllm:num_requests_waiting` and
`vllm:kv_cache_usage_perc`; the Gateway API Inference Extension reads the
same gauges; vLLM's Grafana dashboards read the histograms. So the names,
types, label (`model_name`) and buckets follow vLLM v1's
(`vllm/v1/metrics/loggers.py`); figures vLLM has no name for are
`mlx_relay:` metrics (`wire/metrics.py` names them).

Two sources: the per-request histograms and counters are fed by the sink
through `pipeline/observe.py` as requests finish; the gauges and our own
counters are read from the `/stats` snapshot when scraped. One registry
per app, so several servers in one process never share a series.
"""

from __future__ import annotations

from collections.abc import Iterable

import attrs
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.registry import Collector

from pipeline.observe import RequestRecord
from pipeline.requests import JsonObject
from wire.loads import LoadInputs, loads_body
from wire.metrics import snapshot_metrics

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_LABEL = ("model_name",)

# vLLM v1's buckets, so its dashboards' quantiles mean the same here.
_TTFT = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
         80.0, 160.0, 640.0, 2560.0)
_ITL = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
_REQUEST = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0,
            960.0, 1920.0, 7680.0)


def _token_buckets(max_tokens: int) -> tuple[float, ...]:
    """1, 2, 5, 10, 20, 50, … up to the context window, as vLLM builds them."""
    buckets: list[float] = []
    exponent = 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10**exponent
            if value > max_tokens:
                return tuple(buckets)
            buckets.append(float(value))
        exponent += 1


# eq=False: the registry keys collectors by identity.
@attrs.define(eq=False)
class _Snapshot(Collector):
    """The gauges and counters read off the latest `/stats` snapshot."""

    model_name: str = ""
    snapshot: JsonObject = attrs.field(factory=dict)

    def collect(self) -> Iterable[Metric]:
        for figure in snapshot_metrics(self.snapshot):
            family = CounterMetricFamily if figure.counter else GaugeMetricFamily
            metric = family(figure.name, figure.help, labels=_LABEL)
            metric.add_metric([self.model_name], figure.value)
            yield metric
        info = InfoMetricFamily("mlx_relay:build", "The model served and the BLAS in use", labels=_LABEL)
        info.add_metric([self.model_name], {"blas": str(self.snapshot.get("blas") or "none")})
        yield info


@attrs.define
class Metrics:
    """The registry of one app; a `RequestObserver` for its engine's sink.

    Made before the engine starts (the engine takes it), so the model's
    name and window arrive by `configure` once the model is loaded.
    """

    registry: CollectorRegistry = attrs.field(factory=lambda: CollectorRegistry(auto_describe=True), init=False)
    _snapshot: _Snapshot = attrs.field(factory=_Snapshot, init=False)
    _histograms: dict[str, Histogram] = attrs.field(factory=dict, init=False)
    _counters: dict[str, Counter] = attrs.field(factory=dict, init=False)
    # Since start, for /v1/loads' cache_hit_rate.
    _queried_tokens: int = attrs.field(default=0, init=False)
    _hit_tokens: int = attrs.field(default=0, init=False)
    # (time, generated tokens) at the previous /v1/loads, for gen_throughput.
    _last_sample: tuple[float, int] | None = attrs.field(default=None, init=False)

    def configure(self, *, model_name: str, context_window: int) -> None:
        """Builds the metrics; the token histograms' buckets run up to the context window."""
        self._snapshot.model_name = model_name
        tokens = _token_buckets(context_window)
        for name, text, buckets in (
            ("vllm:time_to_first_token_seconds", "Time to first token, from the request's arrival", _TTFT),
            ("vllm:inter_token_latency_seconds", "Time between two tokens of one request", _ITL),
            ("vllm:e2e_request_latency_seconds", "Request latency, arrival to last token", _REQUEST),
            ("vllm:request_queue_time_seconds", "Time waiting for a batch row", _REQUEST),
            ("vllm:request_prefill_time_seconds", "Time in prefill (admitted to first token)", _REQUEST),
            ("vllm:request_decode_time_seconds", "Time in decode (first token to last)", _REQUEST),
            ("vllm:request_inference_time_seconds", "Time in the batch (prefill and decode)", _REQUEST),
            ("vllm:request_prompt_tokens", "Prompt tokens per request", tokens),
            ("vllm:request_generation_tokens", "Generated tokens per request", tokens),
        ):
            self._histograms[name] = Histogram(name, text, _LABEL, buckets=buckets, registry=self.registry)
        for name, text, labels in (
            ("vllm:prompt_tokens", "Prompt tokens of finished requests", _LABEL),
            ("vllm:generation_tokens", "Generated tokens of finished requests", _LABEL),
            ("vllm:request_success", "Requests that left the batch, by finish reason", (*_LABEL, "finished_reason")),
            ("vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix cache", _LABEL),
            ("vllm:prefix_cache_hits", "Prompt tokens found in the prefix cache", _LABEL),
        ):
            self._counters[name] = Counter(name, text, labels, registry=self.registry)
        self.registry.register(self._snapshot)
        # Every series exists from the start, at 0, so a rate() over the first requests is right.
        for histogram in self._histograms.values():
            histogram.labels(model_name)
        for counter_name, counter in self._counters.items():
            if counter_name == "vllm:request_success":
                for reason in ("stop", "length", "abort"):
                    counter.labels(model_name, reason)
            else:
                counter.labels(model_name)

    @property
    def model_name(self) -> str:
        return self._snapshot.model_name

    @property
    def cache_hit_rate(self) -> float:
        return self._hit_tokens / self._queried_tokens if self._queried_tokens else 0.0

    def gen_throughput(self, generated_tokens: int, now: float) -> float:
        """Tokens per second since the previous call (0 on the first)."""
        last, self._last_sample = self._last_sample, (now, generated_tokens)
        if last is None or now <= last[0]:
            return 0.0
        return max(0, generated_tokens - last[1]) / (now - last[0])

    def token_gap(self, seconds: float) -> None:
        if self._histograms:
            self._histogram("vllm:inter_token_latency_seconds").observe(seconds)

    def finished(self, record: RequestRecord) -> None:
        self._queried_tokens += record.prompt_tokens
        self._hit_tokens += record.cached_tokens
        if not self._histograms:
            return  # not configured yet: no request can finish before the model loads
        name = self.model_name
        for metric, value in (
            ("vllm:time_to_first_token_seconds", record.first_token),
            ("vllm:e2e_request_latency_seconds", record.total),
            ("vllm:request_queue_time_seconds", record.queue),
            ("vllm:request_prefill_time_seconds", record.prefill),
            ("vllm:request_decode_time_seconds", record.decode),
            ("vllm:request_inference_time_seconds", _sum(record.prefill, record.decode)),
        ):
            if value is not None:
                self._histogram(metric).observe(value)
        self._histogram("vllm:request_prompt_tokens").observe(record.prompt_tokens)
        self._histogram("vllm:request_generation_tokens").observe(record.completion_tokens)
        self._counters["vllm:prompt_tokens"].labels(name).inc(record.prompt_tokens)
        self._counters["vllm:generation_tokens"].labels(name).inc(record.completion_tokens)
        self._counters["vllm:request_success"].labels(name, record.finish_reason).inc()
        self._counters["vllm:prefix_cache_queries"].labels(name).inc(record.prompt_tokens)
        self._counters["vllm:prefix_cache_hits"].labels(name).inc(record.cached_tokens)

    def loads(self, snapshot: JsonObject, *, kv_bytes_per_token: int, max_batch: int, now: float) -> JsonObject:
        """`GET /v1/loads`: the snapshot and this registry's own figures, in SGLang's shape."""
        gateway = snapshot.get("gateway")
        generated = gateway.get("generated_tokens") if isinstance(gateway, dict) else 0
        inputs = LoadInputs(
            snapshot=snapshot, kv_bytes_per_token=kv_bytes_per_token, max_running_requests=max_batch,
            gen_throughput=self.gen_throughput(generated if isinstance(generated, int) else 0, now),
            cache_hit_rate=self.cache_hit_rate, version="mlx-relay",
        )
        return loads_body(inputs, now=now)

    def render(self, snapshot: JsonObject) -> bytes:
        """The exposition text, with the snapshot's gauges as they are now."""
        self._snapshot.snapshot = snapshot
        return generate_latest(self.registry)

    def _histogram(self, name: str) -> Histogram:
        return self._histograms[name].labels(self.model_name)


def _sum(first: float | None, second: float | None) -> float | None:
    return None if first is None or second is None else first + second

