"""The engine's error tree. Each class is answered over HTTP by one row of ENGINE_HTTP
(zgtool.engine.server.errors) and, met at the command line, exits with one row of ENGINE_EXIT
(zgtool.commands.engine_errors); docs/errors.md prints both tables (a test keeps them equal).

    EngineError
    ├── InvalidRequest              bad input (empty prompt, max_tokens < 1, ...)
    │   └── ContextLengthExceeded   names both counts
    ├── ModelNotFound               unknown model string / path
    ├── ModelLoadError              at start-up: missing files, unsupported architecture
    │   └── ModelUnavailable        a packaged model's package is missing or its file damaged
    ├── Overloaded                  KV pool and waiting queue saturated
    ├── SequenceFault               fails the sequences named, only (non-finite logits, a step that
    │                               fails with one sequence in it): the rest of the batch goes on
    └── EngineStopped               shutting down"""

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
