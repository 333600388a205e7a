"""The exception hierarchy: everything the SDK raises on purpose derives from `SpecPrefillError`.

Catch `SpecPrefillError` to handle any failure of the SDK; catch a subclass to handle one kind.
Each subclass carries an OpenAI-style error ``type``/``code`` and an HTTP status, so the server can
answer with a 4xx body without guessing.
"""

from __future__ import annotations

__all__ = [
    "BackendUnavailableError",
    "ContextTooLongError",
    "InvalidRequestError",
    "ModelLoadError",
    "NotFoundError",
    "PolicyError",
    "RequestCancelledError",
    "SpecPrefillError",
]


class SpecPrefillError(Exception):
    """Base class of every error the SDK raises on purpose."""

    status_code: int = 500
    error_type: str = "specprefill_error"
    code: str | None = None

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code

    def to_openai(self) -> dict[str, object]:
        """The OpenAI-style error body: ``{"error": {"message", "type", "param", "code"}}``."""
        return {"error": {"message": self.message, "type": self.error_type, "param": self.param, "code": self.code}}


class InvalidRequestError(SpecPrefillError, ValueError):
    """The caller gave something the SDK cannot use (empty prompt, keep rate out of range, ...)."""

    status_code = 400
    error_type = "invalid_request_error"
    code = "invalid_value"


class ContextTooLongError(InvalidRequestError):
    """The prompt (plus the requested output) does not fit into the model's context window."""

    status_code = 400
    code = "context_length_exceeded"


class PolicyError(InvalidRequestError):
    """An unknown policy name or an invalid policy field."""

    code = "invalid_policy"


class NotFoundError(SpecPrefillError, LookupError):
    """A named thing (model, conversation) does not exist."""

    status_code = 404
    error_type = "not_found_error"
    code = "not_found"


class ModelLoadError(SpecPrefillError):
    """A model or tokenizer could not be found or loaded."""

    status_code = 404
    error_type = "model_load_error"
    code = "model_not_found"


class BackendUnavailableError(SpecPrefillError, ConnectionError):
    """A backend (remote server, GPU engine) cannot be reached or refused the work."""

    status_code = 503
    error_type = "backend_unavailable"
    code = "backend_unavailable"


class RequestCancelledError(SpecPrefillError):
    """The request was cancelled (its client went away) before its work ran; nothing falls back for it."""

    status_code = 499  # "client closed request": nobody reads the answer
    error_type = "request_cancelled"
    code = "request_cancelled"
