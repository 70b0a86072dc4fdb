"""``textgen serve``'s Prometheus metrics, in a registry of their own: requests by outcome, characters sent, time to
first character and request durations, the queue and busy rows, and the prompt cache's figures. No TensorFlow here.
"""

from __future__ import annotations

from collections.abc import Iterator

import prometheus_client as prom
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from textgen.engine import Engine

# Time to first character: tens of milliseconds when a row is free, up to seconds when queued.
TTFC_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


DURATION_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)


class Metrics:
    """The server's Prometheus metrics, in a registry of its own."""

    def __init__(self, engine: Engine) -> None:
        self.registry = prom.CollectorRegistry()
        self.requests = prom.Counter(
            "textgen_requests", "Completion requests by outcome", ["outcome"], registry=self.registry
        )
        prom.Gauge("textgen_queue_length", "Requests waiting for rows", registry=self.registry).set_function(
            lambda: engine.queue_length
        )
        prom.Gauge("textgen_rows_busy", "Rows generating or reading a prompt", registry=self.registry).set_function(
            lambda: engine.busy_rows
        )
        self.chars = prom.Counter("textgen_chars_generated", "Characters sent to clients", registry=self.registry)
        self.first_char = prom.Histogram(
            "textgen_time_to_first_char_seconds",
            "From a request's arrival to its first generated character",
            buckets=TTFC_BUCKETS,
            registry=self.registry,
        )
        self.duration = prom.Histogram(
            "textgen_request_duration_seconds",
            "From a request's arrival to its last event",
            buckets=DURATION_BUCKETS,
            registry=self.registry,
        )
        self.registry.register(_PromptCacheCollector(engine))


class _PromptCacheCollector(prom.registry.Collector):
    """The prompt cache's figures, read from the cache when scraped: hits and the characters they spared the model,
    and its size."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def collect(self) -> Iterator[prom.Metric]:
        cache = self.engine.cache
        yield CounterMetricFamily(
            "textgen_prompt_cache_hits", "Prompts that started from a cached prefix's state", value=cache.hits
        )
        yield CounterMetricFamily(
            "textgen_prompt_cache_characters",
            "Prompt characters not read again: started past from the prompt cache",
            value=cache.characters,
        )
        yield GaugeMetricFamily("textgen_prompt_cache_entries", "Prompt states held in the cache", value=len(cache))
        yield GaugeMetricFamily("textgen_prompt_cache_bytes", "Bytes of the prompt states held", value=cache.bytes)
