"""Retry delays: bounded, jittered (stably), and never past the remaining saga budget."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from processor import SagaDefinitionError
from processor._authoring.orchestration import RetryPolicy, jitter_fraction

NOW = datetime(2026, 1, 1, tzinfo=UTC)

policies = st.builds(
    lambda attempts, base, extra, jitter: RetryPolicy(
        max_attempts=attempts,
        base_delay=timedelta(milliseconds=base),
        max_delay=timedelta(milliseconds=base + extra),
        jitter=jitter,
    ),
    st.integers(1, 20),
    st.integers(1, 60_000),
    st.integers(0, 3_600_000),
    st.floats(0.0, 1.0),
)


@given(policies, st.integers(1, 100), st.text(max_size=20))
def test_delay_is_bounded_and_jittered_within_its_share(
    policy: RetryPolicy, attempt: int, key: str
) -> None:
    delay = policy.delay(attempt, key)
    ceiling = policy.ceiling(attempt)
    assert ceiling <= policy.max_delay
    assert delay <= ceiling
    # Jitter removes at most its fraction (a microsecond of float rounding aside).
    assert delay >= ceiling * (1 - policy.jitter) - timedelta(microseconds=1)
    assert delay == policy.delay(attempt, key)  # replay picks the same delay


@given(policies, st.integers(1, 30), st.integers(0, 10_000_000), st.integers(0, 600_000))
def test_next_attempt_never_starts_past_the_budget(
    policy: RetryPolicy, attempt: int, budget_ms: int, min_ms: int
) -> None:
    budget_end = NOW + timedelta(milliseconds=budget_ms)
    min_budget = timedelta(milliseconds=min_ms)
    at = policy.next_attempt_at(
        attempt, NOW, "saga:step", budget_end=budget_end, min_budget=min_budget
    )
    if attempt >= policy.max_attempts:
        assert at is None
    if at is not None:
        assert at > NOW or policy.delay(attempt, "saga:step") == timedelta(0)
        assert at + min_budget <= budget_end


def test_jitter_spreads_sagas_apart_but_is_stable_per_key() -> None:
    fractions = {jitter_fraction(f"order-{i}:reserve#1") for i in range(200)}
    assert len(fractions) == 200
    assert all(0.0 <= f < 1.0 for f in fractions)
    assert jitter_fraction("a") == jitter_fraction("a")


def test_exponential_growth_capped_at_max_delay() -> None:
    policy = RetryPolicy(
        max_attempts=10,
        base_delay=timedelta(seconds=1),
        max_delay=timedelta(seconds=5),
        jitter=0,
    )
    assert [policy.delay(n, "k").total_seconds() for n in range(1, 6)] == [1, 2, 4, 5, 5]
    assert policy.ceiling(10_000) == timedelta(seconds=5)


def test_invalid_policies_are_rejected_with_every_problem() -> None:
    with pytest.raises(SagaDefinitionError) as info:
        RetryPolicy(max_attempts=0, base_delay=timedelta(0), jitter=2.0)
    assert len(info.value.problems) == 3
