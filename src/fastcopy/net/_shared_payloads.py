"""A publisher's payloads written into Zenoh shared memory of its own, for a Zenoh connection
whose every peer Zenoh reaches through shared memory (fastcopy.net.through_shared_memory_only).

Given a bytes or bytearray payload, Zenoh's put copies it into a buffer of its own, and where the
peer is on the same host it copies that buffer once more into its shared-memory pool and sends
the peer where it lies. A payload written into a buffer of Zenoh's shared memory
(``zenoh.shm.ShmProvider``) goes to such a peer as it is: one copy of the payload fewer per
message (evidence: net-payloads-in-own-shared-memory). Zenoh's Python buffers of shared memory
take bytes or a bytearray (zenoh-python 1.10 exports no buffer for fastcopy's kernels to write
into), so the payload is still built in the publisher's bytearray first.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

# The pool of shared memory each publisher makes when it first needs one: the size of Zenoh's own
# pool for payloads it moves through shared memory (its transport_optimization/pool_size). Zenoh
# reserves the pool's pages when it makes it (a /dev/shm too small is an error here, never a
# fault later), so a publisher on one host holds this much memory once it has sent a payload
# this way.
POOL_BYTES = 16 << 20

# Payloads from this size go through the pool: Zenoh's own threshold for moving a payload through
# shared memory (transport_optimization/message_size). A smaller one is put as it is.
SMALLEST = 3 << 10


class SharedPayloads:
    """``put(payload)``: a payload of SMALLEST bytes or more is copied into a buffer of this
    publisher's pool of Zenoh shared memory and put from there; a smaller one, or one the pool
    has no room for (subscribers still hold its buffers), is put as it is, and Zenoh moves it
    its own way. A pool that cannot be made (no ``zenoh.shm``, /dev/shm too small) is given up
    for good: ``unavailable`` says why, and every payload is put as it is."""

    def __init__(self, put: Callable[[Any], Any]) -> None:
        self._put = put
        self._provider: Any = None
        self._policy: Any = None
        self._zbytes: Any = None
        self.unavailable: Optional[str] = None
        self.through_pool = 0  # payloads put from the pool
        self.pool_full = 0     # payloads put as they are because the pool had no room

    def _buffer(self, n: int) -> Any:
        """A buffer of n bytes from the pool, or None."""
        if self._provider is None:
            if self.unavailable is not None:
                return None
            try:
                import zenoh
                from zenoh import shm

                self._provider = shm.ShmProvider.default_backend(POOL_BYTES)
            except Exception as exc:  # noqa: BLE001 - any failure leaves Zenoh's own path
                self.unavailable = f"{type(exc).__name__}: {exc}"
                return None
            # Takes back the buffers that subscribers have let go of when the pool is full, and
            # never waits: a publisher in drop mode must not block here.
            self._policy = shm.GarbageCollect()
            self._zbytes = zenoh.ZBytes
        try:
            return self._provider.alloc(n, self._policy)
        except Exception:  # noqa: BLE001 - zenoh.ZError "out of memory": every buffer is held
            self.pool_full += 1
            return None

    def close(self) -> None:
        """Lets the pool go (Zenoh frees it once no subscriber holds a buffer of it); payloads
        put after this go as they are."""
        self._provider = None
        self.unavailable = self.unavailable or "closed"

    def put(self, payload: Any) -> None:
        n = len(payload)
        buf = self._buffer(n) if n >= SMALLEST else None
        if buf is None:
            self._put(payload)
            return
        buf[:] = payload
        self._put(self._zbytes(buf))
        self.through_pool += 1
