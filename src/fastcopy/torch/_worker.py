"""The worker process of fastcopy.torch.Loader: reads batch orders from its index channel,
gets the samples from the dataset and collates each field of the batch straight into a loan
of its data channel (``fastcopy.stack`` of the samples into the slot: one copy, no pickling of
tensors, no file descriptor per batch).

Per batch the data channel carries a small description (a pickled ``(batch number, spec,
error)``, a uint8 message) and then one loaned message per field of the spec, in order.
``spec`` describes the structure of a sample: ``None`` (an array), ``("list", n)``,
``("tuple", n)`` (collated as a list, as DataLoader does), ``("namedtuple", type)`` or
``("dict", keys)``, with the specs of its fields after it (see flatten). ``error`` is None, or
``(type name, text, traceback)`` when getting or collating the batch raised: its fields are
not sent then (batch number -1: ``worker_init_fn`` raised, and the worker ended).
"""

from __future__ import annotations

import pickle
import random
import signal
import traceback
from typing import Any, List, Optional, Tuple

import numpy as np

import fastcopy
from fastcopy.shm import Channel, ChannelClosed, PeerDied

# An index message of this length ends the worker.
STOP = np.empty(0, np.int64)


def leaf(x: Any) -> np.ndarray:
    """A field of a sample as a numpy array: torch tensors through .numpy() (in place)."""
    if type(x).__module__.startswith("torch"):
        return x.detach().numpy()
    return np.asarray(x)


def flatten(sample: Any, out: List[Any]) -> Any:
    """The spec of `sample` (see the module), appending its arrays to `out` in order."""
    if isinstance(sample, dict):
        keys = list(sample)
        return ("dict", keys, [flatten(sample[k], out) for k in keys])
    if isinstance(sample, tuple) and hasattr(sample, "_fields"):
        return ("namedtuple", type(sample), [flatten(v, out) for v in sample])
    if isinstance(sample, (tuple, list)):
        return ("list", len(sample), [flatten(v, out) for v in sample])
    out.append(leaf(sample))
    return None


def collate_into(ch: Channel, samples: List[Any]) -> Tuple[Any, List[List[np.ndarray]]]:
    """The spec of the batch and, per field, the arrays of its samples (checked to match)."""
    fields: List[List[np.ndarray]] = []
    spec = None
    for n, s in enumerate(samples):
        arrays: List[np.ndarray] = []
        sp = flatten(s, arrays)
        if n == 0:
            spec = sp
            fields = [[a] for a in arrays]
        else:
            if sp != spec or len(arrays) != len(fields):
                raise TypeError(f"sample {n} of the batch has another structure than sample 0: {sp!r} vs {spec!r}")
            for f, a in zip(fields, arrays):
                f.append(a)
    for k, f in enumerate(fields):
        first = f[0]
        for n, a in enumerate(f):
            if a.shape != first.shape or a.dtype != first.dtype:
                raise ValueError(f"field {k} of sample {n} is {a.dtype} {a.shape}, of sample 0 {first.dtype} "
                                 f"{first.shape}: the samples of a batch stack only when they agree")
        nbytes = first.nbytes * len(f)
        # A field is one message in the ring, with its header and the page it may skip to.
        if nbytes + 2 * 4096 > ch.capacity:
            raise ValueError(f"field {k} of the batch has {nbytes} bytes, more than the worker's ring holds "
                             f"({ch.capacity} bytes): give the Loader a larger ring_bytes")
    return spec, fields


def send_error(data: Channel, batch_no: int, e: BaseException) -> None:
    """The description of a batch that failed with `e` (batch -1: worker_init_fn failed)."""
    meta = (batch_no, None, (type(e).__name__, str(e), traceback.format_exc()))
    data.send(np.frombuffer(pickle.dumps(meta), np.uint8))


def run(worker_id: int, dataset: Any, idx_name: str, data_name: str, base_seed: int,
        worker_init_fn: Optional[Any]) -> None:
    """The worker's loop: until the stop order, or until the main process is gone."""
    # Ctrl-C reaches the whole process group: the main process stops the workers itself.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    import torch

    torch.set_num_threads(1)
    seed = base_seed + worker_id
    torch.manual_seed(seed)
    random.seed(seed)
    idx = Channel.attach(idx_name)
    data = Channel.attach(data_name)
    try:
        if worker_init_fn is not None:
            try:
                worker_init_fn(worker_id)
            except Exception as e:  # reported as the answer to the first batch; the worker ends
                send_error(data, -1, e)
                return
        while True:
            order = idx.recv()
            if len(order) == 0:
                return
            batch_no = int(order[0])
            try:
                spec, fields = collate_into(data, [dataset[int(i)] for i in order[1:]])
            except Exception as e:  # sent to the main process, which raises it there
                send_error(data, batch_no, e)
                continue
            data.send(np.frombuffer(pickle.dumps((batch_no, spec, None)), np.uint8))
            for arrays in fields:
                first = arrays[0]
                with data.loan((len(arrays),) + first.shape, first.dtype) as slot:
                    fastcopy.stack(arrays, out=slot)
    except (ChannelClosed, PeerDied):
        return  # the main process closed or is gone
    finally:
        idx.close()
        data.close()
