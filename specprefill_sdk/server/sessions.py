"""Server-side conversations: a bounded store of `Conversation` objects keyed by (API key hash, id).

A conversation is started by a chat request with ``specprefill.conversation_start``; later requests
name it with ``specprefill.conversation_id`` and send only the new message. The store holds at most
``max_conversations``, and one owner (API key) at most ``max_per_owner`` of them; one idle for
``ttl_s`` seconds expires. A start that would exceed its owner's share evicts that owner's least
recently used idle conversation. A start into a full store evicts, in this order, the caller's own
least recently used idle conversation, else the least recently used idle one of the owner (among
those with idle ones) that holds the most. A conversation that is answering a request is never
evicted: when no idle one may go, the start is refused with 429. So one key can neither fill the
store nor evict another key's conversations while it holds no more than its share. A conversation
serves one request at a time: a second request while one runs gets 409.

Every method is called on the server's event loop (the model work runs elsewhere), so claiming a
conversation and marking it busy happen without a race; a lock still guards the maps.

Example::

    store = ConversationStore(ttl_s=600, max_conversations=32, max_per_owner=8)
    entry = store.reserve("", "chat-1")          # a new, busy entry (the first turn runs next)
    entry.conversation = conversation
    store.release(entry)                         # idle again; its TTL runs from now
    entry = store.claim("", "chat-1")            # the next turn
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..errors import NotFoundError
from .errors import ConflictError, TooManyConversationsError

if TYPE_CHECKING:
    from ..conversation import Conversation

__all__ = ["ConversationStore", "StoredConversation", "key_owner", "new_conversation_id"]

logger = logging.getLogger(__name__)

#: Ended conversations remembered per stored one, so that a late request learns why its id is gone.
_ENDED_PER_SLOT = 8
_ENDED_MIN = 256


def key_owner(api_key: str | None) -> str:
    """The owner part of a conversation's key: a hash of the caller's API key ("" without keys)."""
    if not api_key:
        return ""
    return hashlib.sha256(api_key.encode()).hexdigest()


def new_conversation_id() -> str:
    """A fresh, unguessable conversation id (``conv_`` and 32 hex digits)."""
    return f"conv_{uuid.uuid4().hex}"


@dataclass(eq=False)
class StoredConversation:
    """One stored conversation: the `Conversation` (None until its first turn is set up) and its state."""

    owner: str
    id: str
    created: float = field(default_factory=time.time)
    last_used: float = field(default_factory=time.time)
    conversation: Conversation | None = None
    busy: bool = True
    #: Set when a turn failed after it began: the caches may be half-updated, so the entry is dropped.
    failed: str | None = None
    _idle_since: float = field(default_factory=time.monotonic)

    @property
    def key(self) -> tuple[str, str]:
        return (self.owner, self.id)


class ConversationStore:
    """Conversations by (owner, id): TTL after the last use, a maximum count and a share per owner, LRU eviction.

    Args:
        ttl_s: seconds a conversation may stay idle before it expires.
        max_conversations: how many are stored at once (0: conversations are not served).
        max_per_owner: how many one owner (API key) may hold at once; None: ``max_conversations``.
        clock: the monotonic clock (seconds) for TTLs.
    """

    def __init__(
        self,
        ttl_s: float,
        max_conversations: int,
        *,
        max_per_owner: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if ttl_s <= 0:
            raise ValueError("ttl_s must be > 0")
        if max_conversations < 0:
            raise ValueError("max_conversations must be >= 0")
        if max_per_owner is not None and max_per_owner < 1:
            raise ValueError("max_per_owner must be >= 1")
        self.ttl_s = float(ttl_s)
        self.max_conversations = max_conversations
        self.max_per_owner = min(max_conversations, max_per_owner or max_conversations)
        self._clock = clock
        self._entries: OrderedDict[tuple[str, str], StoredConversation] = OrderedDict()
        self._ended: OrderedDict[tuple[str, str], str] = OrderedDict()
        self._ended_max = max(_ENDED_MIN, _ENDED_PER_SLOT * max_conversations)
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def enabled(self) -> bool:
        return self.max_conversations > 0

    # ----------------------------------------------------------------- life cycle
    def reserve(self, owner: str, conversation_id: str) -> StoredConversation:
        """A new busy entry for a conversation about to start; makes room by eviction (see the module docs).

        Raises:
            ConflictError: the owner already has a conversation with this id (409).
            TooManyConversationsError: the owner holds its share, or the store is full, and none of the
                conversations that could make room is idle (429).
        """
        with self._lock:
            self._sweep_locked()
            key = (owner, conversation_id)
            if key in self._entries:
                raise ConflictError(
                    f"conversation {conversation_id!r} already exists; continue it without "
                    "specprefill.conversation_start, or end it with DELETE /v1/conversations/{id}",
                    param="specprefill.conversation_id",
                    code="conversation_exists",
                )
            self._make_room_locked(owner)
            self._ended.pop(key, None)
            entry = StoredConversation(owner, conversation_id)
            self._entries[key] = entry
            return entry

    def claim(self, owner: str, conversation_id: str) -> StoredConversation:
        """The owner's conversation, marked busy for one request.

        Raises:
            NotFoundError: unknown, expired, evicted or deleted (404, ``conversation_not_found``).
            ConflictError: another request is using it right now (409, ``conversation_busy``).
        """
        with self._lock:
            self._sweep_locked()
            entry = self._find_locked(owner, conversation_id)
            if entry.busy:
                raise _busy(conversation_id)
            entry.busy = True
            self._entries.move_to_end(entry.key)
            return entry

    def peek(self, owner: str, conversation_id: str) -> StoredConversation:
        """The owner's conversation without claiming it or extending its TTL (404 when absent)."""
        with self._lock:
            self._sweep_locked()
            entry = self._find_locked(owner, conversation_id)
            if entry.conversation is None:
                raise _busy(conversation_id)
            return entry

    def release(self, entry: StoredConversation) -> None:
        """End a request's use: idle again (TTL from now), or dropped if its turn failed or never began."""
        with self._lock:
            if self._entries.get(entry.key) is not entry:
                return
            if entry.conversation is None:
                # The first turn was refused before it began: the id is free again.
                del self._entries[entry.key]
                return
            if entry.failed is not None:
                self._end_locked(entry, f"ended because a turn failed ({entry.failed})")
                return
            entry.busy = False
            entry.last_used = time.time()
            entry._idle_since = self._clock()
            self._entries.move_to_end(entry.key)

    def delete(self, owner: str, conversation_id: str) -> None:
        """End the owner's conversation now.

        Raises:
            NotFoundError: no such conversation (404).
            ConflictError: a request is using it (409).
        """
        with self._lock:
            self._sweep_locked()
            entry = self._find_locked(owner, conversation_id)
            if entry.busy:
                raise _busy(conversation_id)
            self._end_locked(entry, "was deleted")

    def sweep(self) -> int:
        """Drop the conversations idle for longer than the TTL; returns how many."""
        with self._lock:
            return self._sweep_locked()

    def expires_in(self, entry: StoredConversation) -> float:
        """Seconds until ``entry`` expires if no request uses it (the TTL while it is in use)."""
        if entry.busy:
            return self.ttl_s
        return max(0.0, self.ttl_s - (self._clock() - entry._idle_since))

    # ----------------------------------------------------------------- internals
    def _find_locked(self, owner: str, conversation_id: str) -> StoredConversation:
        key = (owner, conversation_id)
        entry = self._entries.get(key)
        if entry is not None:
            return entry
        why = self._ended.get(key)
        what = f"conversation {conversation_id!r} {why}" if why else f"no conversation {conversation_id!r} is known"
        raise NotFoundError(
            f"{what}; start a new one (specprefill.conversation_start) and send the whole history again",
            param="specprefill.conversation_id",
            code="conversation_not_found",
        )

    def _make_room_locked(self, owner: str) -> None:
        """Evict idle conversations until ``owner`` may start one (see the module docs), or raise 429."""
        while True:
            held = [e for e in self._entries.values() if e.owner == owner]
            if len(held) >= self.max_per_owner:
                victim = next((e for e in held if not e.busy), None)
                if victim is None:
                    raise TooManyConversationsError(
                        f"this API key may hold at most {self.max_per_owner} conversations on this server and "
                        "all of them are in use; retry later, or end one with DELETE /v1/conversations/{id}"
                    )
                self._end_locked(
                    victim, f"was evicted: one API key may hold at most {self.max_per_owner} conversations here"
                )
                continue
            if len(self._entries) < self.max_conversations:
                return
            victim = next((e for e in held if not e.busy), None) or self._largest_owners_idle_locked()
            if victim is None:
                raise TooManyConversationsError(
                    f"this server holds at most {self.max_conversations} conversations and all of them are "
                    "in use; retry later"
                )
            self._end_locked(victim, f"was evicted: this server holds at most {self.max_conversations} conversations")

    def _largest_owners_idle_locked(self) -> StoredConversation | None:
        """The least recently used idle conversation of the owner holding the most (None: none idle)."""
        counts: dict[str, int] = {}
        for e in self._entries.values():
            counts[e.owner] = counts.get(e.owner, 0) + 1
        idle = [e for e in self._entries.values() if not e.busy]  # least recently used first
        if not idle:
            return None
        # max() keeps the first of equals: among the largest owners, the least recently used conversation.
        return max(idle, key=lambda e: counts[e.owner])

    def _sweep_locked(self) -> int:
        now = self._clock()
        stale = [e for e in self._entries.values() if not e.busy and now - e._idle_since > self.ttl_s]
        for entry in stale:
            self._end_locked(entry, f"expired after {self.ttl_s:g} s without a request")
        return len(stale)

    def _end_locked(self, entry: StoredConversation, why: str) -> None:
        self._entries.pop(entry.key, None)
        self._ended[entry.key] = why
        self._ended.move_to_end(entry.key)
        while len(self._ended) > self._ended_max:
            self._ended.popitem(last=False)
        logger.info("conversation %s %s", entry.id, why)


def _busy(conversation_id: str) -> ConflictError:
    return ConflictError(
        f"conversation {conversation_id!r} is answering another request; send its turns one at a time",
        param="specprefill.conversation_id",
        code="conversation_busy",
    )
