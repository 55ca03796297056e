"""The stack applies the engine's own body limit at the gateway: a body the engine would
refuse is answered 413 by pygw in the client's API shape, once, never re-sent (issue 16)."""

from __future__ import annotations

import anthropic
import httpx
import pytest

from zgtool.gateway.supervisor import LocalStack, StackConfig


def test_engine_body_limit_is_the_gateway_limit_in_the_stack() -> None:
    cfg = StackConfig(model="null", paths=("stack",), engine_args=("--max-body-bytes", "65536"))
    with LocalStack(cfg) as st:
        body = {"model": "null", "max_tokens": 2, "messages": [{"role": "user", "content": "y" * 100_000}]}
        with pytest.raises(anthropic.APIStatusError) as err:
            anthropic.Anthropic(base_url=st.urls["stack"], api_key="k", max_retries=0).messages.create(**body)
        assert err.value.status_code == 413
        assert err.value.body["error"]["type"] == "request_too_large"
        assert "65536" in err.value.message
        small = {**body, "messages": [{"role": "user", "content": "y" * 1000}]}
        assert httpx.post(st.urls["stack"] + "/v1/messages", json=small, headers={"x-api-key": "k"}).status_code == 200
