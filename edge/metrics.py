"""`GET /metrics`: Prometheus metrics under vLLM's names, and ours under `mlx_relay:`.

Routers and dashboards already read vLLM's names: smg scrapes
`vllm:num_requests_running`, `vllm:num_requests_waiting` and
`vllm:kv_cache_usage_perc`; the Gateway API Inference Extension reads the
same gauges; vLLM's Grafana dashboards read the histograms. So the names,
types, label (`model_name`) and buckets follow vLLM v1's
(`vllm/v1/metrics/loggers.py`); figures vLLM has no name for are
`mlx_relay:` metrics (`wire/metric_figures.py` names them).

Two sources: the per-request histograms and counters are fed by each
model's sink through `pipeline/observe.py` as requests finish; the gauges
and our own counters are read from each loaded model's `/stats` snapshot
when scraped. Every series carries its model in `model_name`, as vLLM's
do, so with several models (fleet/) each has its own. One registry per
app, so several servers in one process never share a series.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import attrs
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.registry import Collector

from edge.mcp_metrics import McpMeter
from pipeline.observe import RequestObserver, RequestRecord
from pipeline.requests import JsonObject
from wire.loads import LoadInputs, loads_body
from wire.metric_figures import server_metrics, snapshot_metrics

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_LABEL = ("model_name",)

# vLLM v1's buckets, so its dashboards' quantiles mean the same here.
_TTFT = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
_ITL = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
_REQUEST = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)


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
class _Snapshots(Collector):
    """The gauges and counters read off each loaded model's latest `/stats` snapshot, one series per model."""

    snapshots: dict[str, JsonObject] = attrs.field(factory=dict)
    # With several models, what belongs to the server, not one model (the Responses store): `model_name` "".
    shared: JsonObject = attrs.field(factory=dict)

    def collect(self) -> Iterable[Metric]:
        families: dict[str, CounterMetricFamily | GaugeMetricFamily] = {}
        snapshots = self.snapshots.items()
        labelled = [(name, figure) for name, snapshot in snapshots for figure in snapshot_metrics(snapshot)]
        for model_name, figure in [*labelled, *(("", figure) for figure in server_metrics(self.shared))]:
            metric = families.get(figure.name)
            if metric is None:
                family = CounterMetricFamily if figure.counter else GaugeMetricFamily
                metric = families[figure.name] = family(figure.name, figure.help, labels=_LABEL)
            metric.add_metric([model_name], figure.value)
        yield from families.values()
        info = InfoMetricFamily("mlx_relay:build", "The model served and the BLAS in use", labels=_LABEL)
        for model_name, snapshot in self.snapshots.items():
            info.add_metric([model_name], {"blas": str(snapshot.get("blas") or "none")})
        yield info


@attrs.define
class _ModelFigures:
    """What `/v1/loads` keeps per model between polls."""

    # Since start, for cache_hit_rate.
    queried_tokens: int = 0
    hit_tokens: int = 0
    # (time, generated tokens) at the previous poll, for gen_throughput.
    last_sample: tuple[float, int] | None = None

    @property
    def cache_hit_rate(self) -> float:
        return self.hit_tokens / self.queried_tokens if self.queried_tokens else 0.0

    def gen_throughput(self, generated_tokens: int, now: float) -> float:
        """Tokens per second since the previous call (0 on the first)."""
        last, self.last_sample = self.last_sample, (now, generated_tokens)
        if last is None or now <= last[0]:
            return 0.0
        return max(0, generated_tokens - last[1]) / (now - last[0])


@attrs.frozen(kw_only=True)
class ModelLoad:
    """One model's inputs to `/v1/loads`."""

    model_name: str
    snapshot: JsonObject
    kv_bytes_per_token: int
    max_batch: int


@attrs.define
class Metrics:
    """The registry of one app, with a `RequestObserver` per model (`observer`) for its engine's sink.

    Made before the engines start (each takes its observer), so the
    histograms' buckets arrive by `configure` once the first model is loaded.
    """

    registry: CollectorRegistry = attrs.field(factory=lambda: CollectorRegistry(auto_describe=True), init=False)
    _snapshots: _Snapshots = attrs.field(factory=_Snapshots, init=False)
    _histograms: dict[str, Histogram] = attrs.field(factory=dict, init=False)
    _counters: dict[str, Counter] = attrs.field(factory=dict, init=False)
    _figures: dict[str, _ModelFigures] = attrs.field(factory=dict, init=False)
    # Each model's inter-token histogram, labelled once: `labels()` locks and looks up on every call, and this
    # one is observed for every streamed token.
    _token_gaps: dict[str, Histogram] = attrs.field(factory=dict, init=False)
    # Remote MCP servers' requests (edge/mcp_metrics.py): no model's, and made now, as a request may come first.
    mcp: McpMeter = attrs.field(init=False, default=attrs.Factory(lambda self: McpMeter(self.registry), True))

    def configure(self, *, model_names: Sequence[str], context_window: int) -> None:
        """Builds the metrics; the token histograms' buckets run up to `context_window` (the largest served)."""
        tokens = _token_buckets(context_window)
        self._token_gaps.clear()
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
        self.registry.register(self._snapshots)
        # Every model's series exists from the start, at 0, so a rate() over its first requests is right.
        for model_name in model_names:
            for histogram in self._histograms.values():
                histogram.labels(model_name)
            for counter_name, counter in self._counters.items():
                if counter_name == "vllm:request_success":
                    for reason in ("stop", "length", "abort"):
                        counter.labels(model_name, reason)
                else:
                    counter.labels(model_name)

    def observer(self, model_name: str) -> RequestObserver:
        """What `model_name`'s sink tells about its requests."""
        return _ModelObserver(self, model_name)

    def cache_hit_rate(self, model_name: str) -> float:
        return self._model(model_name).cache_hit_rate

    def gen_throughput(self, model_name: str, generated_tokens: int, now: float) -> float:
        return self._model(model_name).gen_throughput(generated_tokens, now)

    def token_gap(self, model_name: str, seconds: float) -> None:
        gaps = self._token_gaps.get(model_name)
        if gaps is None:
            if not self._histograms:
                return
            gaps = self._token_gaps[model_name] = self._histograms["vllm:inter_token_latency_seconds"].labels(
                model_name
            )
        gaps.observe(seconds)

    def finished(self, model_name: str, record: RequestRecord) -> None:
        figures = self._model(model_name)
        figures.queried_tokens += record.prompt_tokens
        figures.hit_tokens += record.cached_tokens
        if not self._histograms:
            return  # not configured yet: no request can finish before the first model loads
        name = model_name
        for metric, value in (
            ("vllm:time_to_first_token_seconds", record.first_token),
            ("vllm:e2e_request_latency_seconds", record.total),
            ("vllm:request_queue_time_seconds", record.queue),
            ("vllm:request_prefill_time_seconds", record.prefill),
            ("vllm:request_decode_time_seconds", record.decode),
            ("vllm:request_inference_time_seconds", _sum(record.prefill, record.decode)),
        ):
            if value is not None:
                self._histograms[metric].labels(name).observe(value)
        self._histograms["vllm:request_prompt_tokens"].labels(name).observe(record.prompt_tokens)
        self._histograms["vllm:request_generation_tokens"].labels(name).observe(record.completion_tokens)
        self._counters["vllm:prompt_tokens"].labels(name).inc(record.prompt_tokens)
        self._counters["vllm:generation_tokens"].labels(name).inc(record.completion_tokens)
        self._counters["vllm:request_success"].labels(name, record.finish_reason).inc()
        self._counters["vllm:prefix_cache_queries"].labels(name).inc(record.prompt_tokens)
        self._counters["vllm:prefix_cache_hits"].labels(name).inc(record.cached_tokens)

    def loads(self, models: Sequence[ModelLoad], *, named: bool, now: float) -> JsonObject:
        """`GET /v1/loads`: each model's snapshot and this registry's own figures, in SGLang's shape.

        `named`: each entry says its model (several models are served).
        """
        entries = []
        for model in models:
            gateway = model.snapshot.get("gateway")
            generated = gateway.get("generated_tokens") if isinstance(gateway, dict) else 0
            throughput = self.gen_throughput(model.model_name, generated if isinstance(generated, int) else 0, now)
            entry = LoadInputs(
                snapshot=model.snapshot,
                kv_bytes_per_token=model.kv_bytes_per_token,
                max_running_requests=model.max_batch,
                gen_throughput=throughput,
                cache_hit_rate=self.cache_hit_rate(model.model_name),
                model=model.model_name if named else None,
            )
            entries.append(entry)
        return loads_body(entries, version="mlx-relay", now=now)

    def render(self, snapshots: dict[str, JsonObject], shared: JsonObject | None = None) -> bytes:
        """The exposition text, with each loaded model's gauges as they are now (keyed by model name)."""
        self._snapshots.snapshots, self._snapshots.shared = snapshots, shared or {}
        return generate_latest(self.registry)

    def _model(self, model_name: str) -> _ModelFigures:
        return self._figures.setdefault(model_name, _ModelFigures())


@attrs.frozen
class _ModelObserver:
    """One model's `RequestObserver`: the app's metrics under that model's label."""

    _metrics: Metrics
    _model_name: str

    def token_gap(self, seconds: float) -> None:
        self._metrics.token_gap(self._model_name, seconds)

    def finished(self, record: RequestRecord) -> None:
        self._metrics.finished(self._model_name, record)


def _sum(first: float | None, second: float | None) -> float | None:
    return None if first is None or second is None else first + second
