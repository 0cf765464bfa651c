"""OpenTelemetry spans for batches, handlers, commits and relay rounds; a no-op without it.

The ``otel`` extra installs the API; the application installs and configures an SDK and an
exporter. Until a tracer provider is configured (or without the package) :func:`tracing`
returns None and the loops skip every span, at the cost of one ``is None`` test per batch.

The spans join the producer's trace: a handler's span is a child of its event's
``traceparent``; batch, commit and relay spans cover many records of many traces, so they link
to them (up to :data:`MAX_LINKS`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from processor._wire import HEADER_TRACEPARENT, HEADER_TRACESTATE

__all__ = ["MAX_LINKS", "Tracing", "tracing"]

MAX_LINKS = 64

try:  # the optional extra
    from opentelemetry import trace as _trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError:  # pragma: no cover - exercised where the extra is not installed
    _trace = None  # type: ignore[assignment]


class Tracing:
    """Starts the processor's spans on the configured tracer provider."""

    def __init__(self) -> None:
        assert _trace is not None
        self._tracer = _trace.get_tracer("saga-processor")
        self._propagator = TraceContextTextMapPropagator()

    @contextlib.contextmanager
    def span(
        self,
        name: str,
        *,
        parent: Mapping[str, str] | None = None,
        links: Iterable[Mapping[str, str]] = (),
        attributes: Mapping[str, Any] | None = None,
    ) -> Iterator[None]:
        """A span named ``name``; a child of ``parent``'s trace context when it has one.

        Args:
            name: The span's name (``saga.batch``, ``saga.handler``, ...).
            parent: Headers holding the W3C trace context to continue.
            links: Headers of the records the span covers; each valid context is linked.
            attributes: Span attributes.
        """
        assert _trace is not None
        ctx = self._propagator.extract(dict(parent)) if parent else None
        span_links: list[Any] = []
        for headers in links:
            if len(span_links) >= MAX_LINKS:
                break
            if HEADER_TRACEPARENT not in headers:
                continue
            linked = _trace.get_current_span(self._propagator.extract(dict(headers)))
            sc = linked.get_span_context()
            if sc.is_valid:
                span_links.append(_trace.Link(sc))
        with self._tracer.start_as_current_span(
            name, context=ctx, links=span_links, attributes=dict(attributes or {})
        ):
            yield

    def handler(self, saga_type: str, saga_id: str, headers: Mapping[str, str]) -> Any:
        """The span of one handler call, in its event's trace."""
        return self.span(
            "saga.handler",
            parent=headers,
            attributes={"saga.type": saga_type, "saga.id": saga_id},
        )


def trace_headers(headers: Iterable[tuple[str, bytes]]) -> dict[str, str]:
    """The trace context headers of a record, as text."""
    return {
        k: v.decode("utf-8", errors="replace")
        for k, v in headers
        if k in (HEADER_TRACEPARENT, HEADER_TRACESTATE)
    }


def tracing() -> Tracing | None:
    """A :class:`Tracing` when OpenTelemetry is installed and a tracer provider is set."""
    if _trace is None:
        return None
    if isinstance(
        _trace.get_tracer_provider(), _trace.ProxyTracerProvider | _trace.NoOpTracerProvider
    ):
        return None
    return Tracing()
