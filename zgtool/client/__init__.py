"""A load-hint-aware client over the official anthropic/openai SDKs: honest retries, model fallback.

    from zgtool.client import Client, AutoFallbackPolicy, FallbackConfig, RetryConfig
    policy = AutoFallbackPolicy(FallbackConfig(models=("big", "small")))
    with Client("local", policy=policy) as c:
        result = c.ask("Hello", max_tokens=32)   # AskResult: text, attempts, switches, load_hint

Importing this package imports neither torch nor the SDKs (they load on first Client()).
"""

from __future__ import annotations

from zgtool.client.backends import AttemptFailed, Reply
from zgtool.client.client import AskResult, Client, RequestFailed
from zgtool.client.hints import LoadHint, RateBucket, RateLimits, parse_load_hint, parse_rate_limits
from zgtool.client.policy import AutoFallbackPolicy, FallbackConfig, Observation, Switch
from zgtool.client.retry import Attempt, Decision, Failure, RetryConfig, decide, parse_retry_after_s

__all__ = [
    "AskResult", "Attempt", "AttemptFailed", "AutoFallbackPolicy", "Client", "Decision", "Failure",
    "FallbackConfig", "LoadHint", "Observation", "RateBucket", "RateLimits", "Reply", "RequestFailed",
    "RetryConfig", "Switch", "decide", "parse_load_hint", "parse_rate_limits", "parse_retry_after_s",
]
