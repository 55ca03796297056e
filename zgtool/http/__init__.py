"""zgtool's one HTTP protocol kit, shared by the engine's server and pygw (no copies elsewhere).

    errors.py   ApiError(status, error_type, message, *, headers, extra, code, param)
                error_payload(err, api, request_id) -> dict; error_body(...) -> bytes
                    api = "anthropic" | "openai"; OpenAI bodies carry OpenAI's own type
                    (invalid_request_error, authentication_error, rate_limit_error,
                    server_error, ...) and a code (see the table in errors.py)
                type_for_status(status) -> Anthropic error type
                parse_error_body(body, status) -> ApiError   (an upstream error of either shape)
                KitError (.status) > ConfigError: the kit's own errors (a bad keys or TOML
                    file), mapped once by each caller: CLI exit 2, server status
    body.py     await read_body(receive, limit, content_length) -> bytes   (413 / ClientGone)
                load_json(body) / load_json_object(body)   (every bad body is a 400 ApiError:
                    bad UTF-8 or JSON, deep nesting, huge ints, lone surrogates)
                ClientGone, bad_request(message, param), type_name(value)
    sse.py      SSE_HEADERS, event(name, obj), data(obj), comment(text), DONE
                timing_comment(obj) / parse_timing_comment(text): ": zgtool-timing {json}"
                SSEParser().feed(chunk) -> [Event(event, data, id, retry, comments)];
                    Event.json(), Event.timing
    keys.py     api_key(headers) -> bytes | None   (x-api-key, else Authorization: Bearer)
                load_keys(path) / parse_keys(doc, where) -> KeysConfig(tiers, keys,
                    admin_digests, metrics_require_key, upstream_key_env);
                    KeysConfig.match(secret) -> (ApiKey | None, is_admin); Tier, ApiKey, digest
    toml.py     load_toml(path, what, error=ConfigError), parse_toml(text, where, error)
    net.py      free_port(host="127.0.0.1") -> int
    servertiming.py  server_timing({name: ms}, desc=None) -> header value
    finish.py   anthropic_stop_reason(reason, stop_seq), openai_finish_reason(reason),
                openai_from_anthropic(stop_reason)

Nothing here imports torch, uvicorn or the engine.
"""
