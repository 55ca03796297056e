"""The engine's error tree, mapped once to HTTP statuses by the server
(zgtool.engine.server.errors) and to exit code 2 at the CLI.

    EngineError                     500 api_error
    ├── InvalidRequest              400 invalid_request_error  (empty prompt, max_tokens < 1, ...)
    │   └── ContextLengthExceeded   400 invalid_request_error  (names both counts)
    ├── ModelNotFound               404 not_found_error        (unknown model string / path)
    ├── ModelLoadError              500 (at start-up: missing files, unsupported architecture)
    │   └── ModelUnavailable        a packaged model's package is missing or its file damaged (CLI exit 4)
    ├── Overloaded                  529 overloaded_error       (KV pool and waiting queue saturated)
    ├── SequenceFault               500 for the sequences named, only (non-finite logits, a step that
    │                                   fails with one sequence in it): the rest of the batch goes on
    └── EngineStopped               503 / 529                  (shutting down)
"""

from __future__ import annotations


class EngineError(Exception):
    """Base of every error the engine raises on purpose."""


class InvalidRequest(EngineError):
    pass


class ContextLengthExceeded(InvalidRequest):
    def __init__(self, prompt_tokens: int, max_tokens: int, max_model_len: int) -> None:
        super().__init__(
            f"prompt is {prompt_tokens} tokens and max_tokens is {max_tokens}, "
            f"which exceeds the model's context of {max_model_len} tokens"
            if prompt_tokens < max_model_len
            else f"prompt is {prompt_tokens} tokens, longer than the model's context of {max_model_len} tokens"
        )
        self.prompt_tokens = prompt_tokens
        self.max_tokens = max_tokens
        self.max_model_len = max_model_len


class ModelNotFound(EngineError):
    pass


class ModelLoadError(EngineError):
    pass


class ModelUnavailable(ModelLoadError):
    """A packaged model's Python package is not installed, or its file is damaged; the message
    names the fix (a missing capability of this machine, not a bad request)."""


class Overloaded(EngineError):
    pass


class SequenceFault(EngineError):
    """A step failed because of some of its sequences (`rows`: indices into the step's batch): those
    requests fail, the others are computed again without them (engine.py)."""

    def __init__(self, rows: list[int], message: str) -> None:
        super().__init__(message)
        self.rows = rows
        self.message = message


class EngineStopped(EngineError):
    pass
