"""OpenAI-style error bodies for every failure, and the exception handlers that produce them.

Every answer that is not a success carries ``{"error": {"message", "type", "param", "code"}}``:

====  ==============================  =================================================================
code  ``error.type``                  when
====  ==============================  =================================================================
400   ``invalid_request_error``       malformed JSON, non-UTF-8 body, a body that does not match the
                                      schema (wrong types, out of range: ``invalid_value``, ``param``
                                      the dotted field path), a field the server cannot honour
                                      (``unsupported_parameter``), text with a lone surrogate
                                      (``invalid_text``), a value the SDK rejects (unknown
                                      policy, ids outside the vocabulary, positions beyond the context)
401   ``invalid_request_error``       missing or wrong ``Authorization: Bearer`` key (code
                                      ``invalid_api_key``)
403   ``invalid_request_error``       without API keys, a ``Host`` that is not loopback
                                      (``host_not_allowed``: DNS rebinding)
404   ``not_found_error``             unknown route or model; unknown, expired, evicted or deleted
                                      conversation (code ``conversation_not_found``)
405   ``invalid_request_error``       wrong HTTP method for a route
413   ``invalid_request_error``       body larger than the server accepts, or a prompt longer than
                                      ``--max-prompt-tokens``
409   ``invalid_request_error``       a conversation already answering a request (``conversation_busy``)
                                      or started twice (``conversation_exists``)
408   ``invalid_request_error``       a connection sent part of a request head and not the rest within
                                      ``--header-timeout`` (``request_timeout``; then it is closed)
429   ``rate_limit_error``            the queue is full, or every stored conversation is in use;
                                      ``Retry-After`` says when to come back
503   ``service_unavailable_error``   the server is shutting down (``server_shutting_down``: a queued
                                      or new request, or one still running after ``--shutdown-grace``),
                                      or serves ``--max-connections`` connections already
                                      (``too_many_connections``); ``Retry-After`` says when to come back
====  ==============================  =================================================================
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..errors import SpecPrefillError
from .request_id import REQUEST_ID_HEADER, request_id
from .schemas import UNENCODABLE_TEXT, UNSERVED_FIELD

__all__ = [
    "SHUTDOWN_RETRY_AFTER",
    "AuthenticationError",
    "ConflictError",
    "OverloadedError",
    "RequestTooLargeError",
    "ShuttingDownError",
    "TooManyConversationsError",
    "error_body",
    "error_response",
    "install_error_handlers",
]

logger = logging.getLogger(__name__)


class AuthenticationError(SpecPrefillError):
    """The request lacks the server's API key, or carries a wrong one."""

    status_code = 401
    error_type = "invalid_request_error"
    code = "invalid_api_key"


class RequestTooLargeError(SpecPrefillError):
    """The body, or the prompt it holds, is larger than this server accepts."""

    status_code = 413
    error_type = "invalid_request_error"
    code = "request_too_large"


class OverloadedError(SpecPrefillError):
    """Every worker is busy and the queue is full; retry after ``retry_after`` seconds."""

    status_code = 429
    error_type = "rate_limit_error"
    code = "server_overloaded"

    def __init__(self, message: str, *, retry_after: int = 1) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class ConflictError(SpecPrefillError):
    """The request conflicts with the state of a conversation (in use, or already started)."""

    status_code = 409
    error_type = "invalid_request_error"
    code = "conflict"


class TooManyConversationsError(OverloadedError):
    """The server stores as many conversations as it may and every one of them is in use."""

    code = "too_many_conversations"


class ShuttingDownError(SpecPrefillError):
    """The server is shutting down: the request was refused, or it outlived the shutdown's grace period.

    ``retry_after`` is `SHUTDOWN_RETRY_AFTER`: a load balancer has then sent the retry to another
    instance, or a supervisor has started this one again.
    """

    status_code = 503
    error_type = "service_unavailable_error"
    code = "server_shutting_down"

    def __init__(self, message: str, *, retry_after: int | None = None) -> None:
        super().__init__(message)
        self.retry_after = SHUTDOWN_RETRY_AFTER if retry_after is None else retry_after


#: ``Retry-After`` of an answer refused at shutdown, in seconds (see `ShuttingDownError`).
SHUTDOWN_RETRY_AFTER = 5

#: The errors whose answer carries ``Retry-After`` (their ``retry_after``).
_RETRY_LATER = (OverloadedError, ShuttingDownError)


_HTTP_TYPES: dict[int, tuple[str, str | None]] = {
    400: ("invalid_request_error", "invalid_request"),
    401: ("invalid_request_error", "invalid_api_key"),
    404: ("not_found_error", "not_found"),
    405: ("invalid_request_error", "method_not_allowed"),
    413: ("invalid_request_error", "request_too_large"),
    415: ("invalid_request_error", "unsupported_media_type"),
    429: ("rate_limit_error", "server_overloaded"),
}


def error_body(message: str, error_type: str, *, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    """The OpenAI error object: ``{"error": {"message", "type", "param", "code"}}``."""
    return {"error": {"message": message, "type": error_type, "param": param, "code": code}}


def error_response(exc: SpecPrefillError) -> JSONResponse:
    """A JSON response for an SDK error, with its status and (for 429/401) the matching header."""
    headers: dict[str, str] = {}
    if isinstance(exc, _RETRY_LATER):
        headers["Retry-After"] = str(exc.retry_after)
    if isinstance(exc, AuthenticationError):
        headers["WWW-Authenticate"] = "Bearer"
    status = exc.status_code if 400 <= exc.status_code < 600 else 500
    return JSONResponse(exc.to_openai(), status_code=status, headers=headers or None)


_TYPE_TAGS = frozenset({"str", "int", "float", "bool", "none", "list", "dict"})


def _loc_param(loc: Sequence[Any]) -> str | None:
    """``("body", "specprefill", "keep_rate")`` -> ``"specprefill.keep_rate"``, without union member tags."""
    parts = [str(p) for p in loc if p != "body" and not _is_type_tag(p)]
    return ".".join(parts) or None


def _is_type_tag(part: Any) -> bool:
    # pydantic names the union member that failed, e.g. "constrained-str" or "list[int]".
    return isinstance(part, str) and (part in _TYPE_TAGS or any(c in part for c in "[]-"))


def _validation_message(errors: Sequence[Mapping[str, Any]]) -> tuple[str, str | None, str]:
    """Message, param and code for a list of pydantic errors (all answered with 400).

    OpenAI and vLLM answer a body that does not match the schema with 400 ``invalid_request_error``,
    not FastAPI's 422; the openai client raises its ``BadRequestError`` for 400 only.
    """
    if not errors:
        return "the request body is invalid", None, "invalid_value"
    first = errors[0]
    if first.get("type") == "json_invalid":
        ctx = first.get("ctx") or {}
        return f"the body is not valid JSON: {ctx.get('error', 'decode error')}", None, "invalid_json"
    loc = first.get("loc") or ()
    param = _loc_param(loc)
    if first.get("type") == "missing" and tuple(loc) == ("body",):
        return "the request needs a JSON body", None, "invalid_json"
    # Text no tokenizer can read is not a type or range problem: the request itself is invalid. Among
    # the errors of a union's members it is the one that says what to fix.
    # (pydantic reports "string_unicode" itself where a length constraint made it read the text.)
    unencodable = [err for err in errors if err.get("type") in (UNENCODABLE_TEXT, "string_unicode")]
    if unencodable:
        where = _loc_param(unencodable[0].get("loc") or ())
        message = "not valid Unicode text: a lone surrogate"
        if unencodable[0].get("type") == UNENCODABLE_TEXT:
            message = str(unencodable[0].get("msg"))
        return f"{where or 'body'}: {message}", where, "invalid_text"
    # A field this server cannot honour with the value given: say that, rather than a type problem.
    unserved = [err for err in errors if err.get("type") == UNSERVED_FIELD]
    if unserved:
        where = _loc_param(unserved[0].get("loc") or ())
        return f"{where or 'body'}: {unserved[0].get('msg')}", where, "unsupported_parameter"
    lines = []
    for err in errors[:5]:
        where = _loc_param(err.get("loc") or ()) or "body"
        lines.append(f"{where}: {err.get('msg', 'invalid value')}")
    more = f" (and {len(errors) - 5} more)" if len(errors) > 5 else ""
    return "; ".join(lines) + more, param, "invalid_value"


async def _on_validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = list(exc.errors())
    message, param, code = _validation_message(errors)
    message += _content_type_hint(request, errors)
    return JSONResponse(error_body(message, "invalid_request_error", param=param, code=code), status_code=400)


async def _on_sdk_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, SpecPrefillError)
    if exc.status_code >= 500:
        logger.warning("%s %s failed (request %s): %s", request.method, request.url.path, request_id(request), exc)
    return error_response(exc)


async def _on_http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    error_type, code = _HTTP_TYPES.get(exc.status_code, ("invalid_request_error", None))
    detail = exc.detail if isinstance(exc.detail, str) else json.dumps(exc.detail)
    if exc.status_code == 404 and detail == "Not Found":
        detail = f"no route {request.method} {request.url.path}"
    elif exc.status_code == 400 and detail == "There was an error parsing the body":
        detail = _unreadable_body(exc.__cause__)
        code = "invalid_json"
    headers = dict(exc.headers) if exc.headers else None
    return JSONResponse(error_body(detail, error_type, code=code), status_code=exc.status_code, headers=headers)


def _unreadable_body(cause: BaseException | None) -> str:
    """What is wrong with a body that Python's JSON reader gave up on (FastAPI keeps its error as the cause)."""
    if isinstance(cause, UnicodeDecodeError):
        return f"the body is not UTF-8 text (byte {cause.start}): send JSON encoded as UTF-8"
    if isinstance(cause, RecursionError):
        return "the JSON body nests arrays or objects too deeply to be read"
    if isinstance(cause, ValueError) and "digits" in str(cause):
        return f"the JSON body holds a number too long to be read ({cause})"
    if cause is not None:
        return f"the body could not be read as JSON ({type(cause).__name__}: {cause})"
    return "the body could not be read as JSON"


def _content_type_hint(request: Request, errors: Sequence[Mapping[str, Any]]) -> str:
    """A note for a body refused as a whole because it was not sent as JSON (a form, text)."""
    if not errors or tuple(errors[0].get("loc") or ()) != ("body",):
        return ""
    given = request.headers.get("content-type")
    media = (given or "").split(";", 1)[0].strip().lower()
    if media == "application/json" or media.endswith("+json"):
        return ""
    return f"; send the body as JSON with Content-Type: application/json (this request's Content-Type is {given!r})"


async def _on_unexpected(request: Request, exc: Exception) -> JSONResponse:
    rid = request_id(request)
    logger.exception("unexpected error in %s %s (request %s)", request.method, request.url.path, rid)
    # Starlette answers this one outside every middleware: the request id header is set here.
    return JSONResponse(
        error_body("the server failed to handle this request", "server_error", code="internal_error"),
        status_code=500,
        headers={REQUEST_ID_HEADER: rid} if rid else None,
    )


def install_error_handlers(app: FastAPI) -> None:
    """Make every error an OpenAI-style JSON body (validation, JSON, HTTP, SDK errors, the rest)."""
    app.add_exception_handler(RequestValidationError, _on_validation_error)
    app.add_exception_handler(SpecPrefillError, _on_sdk_error)
    app.add_exception_handler(StarletteHTTPException, _on_http_error)
    app.add_exception_handler(Exception, _on_unexpected)
