"""fastcopy.torch.Loader: a torch Dataset run by worker processes that collate each batch
straight into shared memory; the main process hands the batches out as tensors over
copy-on-write views of it. See docs/usage.md ("Batches from worker processes")."""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import secrets
import signal
from typing import Any, Iterator, List, Optional

import numpy as np
import torch

from ..shm import Channel, ChannelClosed, PeerDied
from ..shm.segments import clean_segments
from . import _worker

#: The prefix of the names of a Loader's segments; ``<prefix><pid>-`` names one main process's.
SEGMENT_PREFIX = "fastcopy-torch-"
# How often a wait for a batch checks that its worker is alive (seconds).
_POLL_S = 0.2
# How long shutdown waits for a worker to stop before it terminates, then kills, it (seconds).
_STOP_S = 2.0


class WorkerError(RuntimeError):
    """A worker of a :class:`Loader` died or raised while making a batch."""


def _death_words(proc: Any) -> str:
    code = proc.exitcode
    if code is None:
        return "it stopped answering"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with status {code}"


def _unflatten(spec: Any, leaves: Iterator[Any]) -> Any:
    """The batch of the structure `spec` (see _worker) from its collated fields, in order."""
    if spec is None:
        return next(leaves)
    kind, what, subs = spec
    if kind == "dict":
        return {k: _unflatten(s, leaves) for k, s in zip(what, subs)}
    if kind == "namedtuple":
        return what(*[_unflatten(s, leaves) for s in subs])
    return [_unflatten(s, leaves) for s in subs]


def _count(spec: Any) -> int:
    return 1 if spec is None else sum(_count(s) for s in spec[2])


class Loader:
    """Batches of ``dataset`` made by ``num_workers`` worker processes, in the order a
    ``torch.utils.data.DataLoader`` with the same arguments gives them.

    Each worker stacks the samples of its batch (numpy arrays, torch tensors, numbers, or
    tuples, lists and dicts of them) straight into its shared-memory ring (``fastcopy.stack``
    into a loan: one copy, no pickling of tensors, no file descriptor per batch). A batch
    arrives as tensors over copy-on-write views of the ring (``recv_view(cow=True)``):
    writable, a write copies only the pages it touches. A batch holds its space in its
    worker's ring until its tensors are gone: keep fewer than ``ring_bytes`` / batch bytes -
    ``prefetch_factor`` batches of one worker alive at once, or the worker waits for room.

    Workers start with each iteration and stop at its end. A worker that dies or raises
    makes the iteration raise :class:`WorkerError` naming the worker and the cause; Ctrl-C
    stops the workers. The segments are removed at the end of every iteration, at
    interpreter exit, and, after a SIGKILL of this process, by the next Loader started on
    this machine or ``python -m fastcopy shm --clean``.
    """

    def __init__(self, dataset: Any, batch_size: int = 1, num_workers: int = 2, shuffle: bool = False,
                 drop_last: bool = False, generator: Optional[torch.Generator] = None, prefetch_factor: int = 2,
                 ring_bytes: int = 64 << 20, timeout: Optional[float] = None, worker_init_fn: Any = None,
                 multiprocessing_context: Any = None) -> None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"Loader: batch_size must be a positive int, got {batch_size!r}")
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
            raise ValueError(f"Loader: num_workers must be a positive int, got {num_workers!r}")
        if isinstance(prefetch_factor, bool) or not isinstance(prefetch_factor, int) or prefetch_factor < 1:
            raise ValueError(f"Loader: prefetch_factor must be a positive int, got {prefetch_factor!r}")
        if timeout is not None and not timeout > 0:
            raise ValueError(f"Loader: timeout must be None or positive seconds, got {timeout!r}")
        self.dataset = dataset
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.generator = generator
        self.prefetch_factor = prefetch_factor
        self.ring_bytes = ring_bytes
        self.timeout = timeout
        self.worker_init_fn = worker_init_fn
        data = torch.utils.data
        sampler = (data.RandomSampler(dataset, generator=generator) if shuffle
                   else data.SequentialSampler(dataset))
        self.batch_sampler = data.BatchSampler(sampler, batch_size, drop_last)
        if multiprocessing_context is None:
            multiprocessing_context = "fork" if "fork" in mp.get_all_start_methods() else "spawn"
        if isinstance(multiprocessing_context, str):
            multiprocessing_context = mp.get_context(multiprocessing_context)
        self.context = multiprocessing_context

    def __len__(self) -> int:
        return len(self.batch_sampler)

    def __iter__(self) -> Iterator[Any]:
        # The same draws from the generator as DataLoader's iterator: the sampler's iterator,
        # then the workers' base seed, then the sampler's permutation at its first batch.
        order = iter(self.batch_sampler)
        base_seed = int(torch.empty((), dtype=torch.int64).random_(generator=self.generator).item())
        run = _Run(self, base_seed)
        try:
            yield from run.batches(order)
        finally:
            run.shutdown()


class _Run:
    """One iteration of a Loader: its workers and their channels."""

    def __init__(self, loader: Loader, base_seed: int) -> None:
        # Segments of Loaders whose main process was killed (their creator is gone).
        clean_segments(SEGMENT_PREFIX)
        self.loader = loader
        self.idx: List[Channel] = []
        self.data: List[Channel] = []
        self.procs: List[Any] = []
        tag = f"{SEGMENT_PREFIX}{os.getpid()}-{secrets.token_hex(4)}"
        n = loader.num_workers
        try:
            for w in range(n):
                # Room for every order in flight (prefetch_factor of them, with their headers and
                # the stop order), so that sending an order never waits for the worker.
                idx_bytes = (loader.prefetch_factor + 1) * (8 * loader.batch_size + 8 + 4096)
                self.idx.append(Channel.create(f"{tag}-w{w}-idx", capacity=max(64 << 10, idx_bytes)))
                self.data.append(Channel.create(f"{tag}-w{w}-data", capacity=loader.ring_bytes))
                self.data[w].peek(timeout=0)  # this process is the consumer from now on (its death is seen)
            for w in range(n):
                p = loader.context.Process(
                    target=_worker.run, name=f"fastcopy.torch worker {w}", daemon=True,
                    args=(w, loader.dataset, self.idx[w].name, self.data[w].name, base_seed,
                          loader.worker_init_fn))
                p.start()
                self.procs.append(p)
        except BaseException:
            self.shutdown()
            raise

    def batches(self, order: Iterator[List[int]]) -> Iterator[Any]:
        n = self.loader.num_workers
        sent = 0
        done = False

        def order_next() -> None:
            nonlocal sent, done
            if done:
                return
            indices = next(order, None)
            if indices is None:
                done = True
                return
            self.idx[sent % n].send(np.asarray([sent] + list(indices), np.int64))
            sent += 1

        for _ in range(self.loader.prefetch_factor * n):
            order_next()
        got = 0
        while got < sent:
            batch = self.receive(got % n, got)
            got += 1
            order_next()
            yield batch

    def receive(self, w: int, batch_no: int) -> Any:
        meta = self.wait(w, lambda t: self.data[w].recv(timeout=t))
        number, spec, error = pickle.loads(meta.tobytes())
        if error is not None:
            kind, text, tb = error
            where = "in worker_init_fn" if number < 0 else f"making batch {number}"
            raise WorkerError(f"worker {w} (pid {self.procs[w].pid}) raised {kind} {where}: "
                              f"{text}\n\nIts traceback:\n{tb}")
        if number != batch_no:  # the worker's protocol, not user input
            raise WorkerError(f"worker {w} sent batch {number} where batch {batch_no} was due")
        fields = [torch.from_numpy(self.wait(w, lambda t: self.data[w].recv_view(timeout=t, cow=True)))
                  for _ in range(_count(spec))]
        return _unflatten(spec, iter(fields))

    def wait(self, w: int, call: Any) -> Any:
        """call(timeout) for worker w's next message, checking between slices that it lives."""
        limit = self.loader.timeout
        waited = 0.0
        while True:
            try:
                return call(_POLL_S)
            except TimeoutError:
                waited += _POLL_S
            except (PeerDied, ChannelClosed):
                self.procs[w].join(_STOP_S)
                raise WorkerError(f"worker {w} (pid {self.procs[w].pid}) died: "
                                  f"{_death_words(self.procs[w])}") from None
            if not self.procs[w].is_alive():
                raise WorkerError(f"worker {w} (pid {self.procs[w].pid}) died: {_death_words(self.procs[w])}")
            if limit is not None and waited >= limit:
                raise WorkerError(f"worker {w} (pid {self.procs[w].pid}) sent no batch for {limit:g} s")

    def shutdown(self) -> None:
        """Stops the workers (asking, then SIGTERM, then SIGKILL) and removes the segments."""
        for ch, p in zip(self.idx, self.procs):
            if p.is_alive():
                try:
                    ch.send(_worker.STOP, timeout=0.1)
                except Exception:
                    pass
        # A worker waiting for room in its ring gets ChannelClosed and ends.
        for ch in self.data:
            ch.close()
        for p in self.procs:
            p.join(_STOP_S)
            if p.is_alive():
                p.terminate()
                p.join(_STOP_S)
            if p.is_alive():
                p.kill()
                p.join()
        for ch in self.idx + self.data:
            ch.close()
            ch.unlink()
        self.idx, self.data, self.procs = [], [], []
