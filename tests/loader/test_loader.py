"""fastcopy.torch.Loader against torch.utils.data.DataLoader: the same batches in the same order
(shuffle off, and on with a fixed generator), of arrays, tensors, numbers and their tuples and
dicts; a worker's exception and a worker's death surface in the main process naming the worker;
Ctrl-C stops the workers and removes the segments; after a SIGKILL of the main process,
``python -m fastcopy shm --clean`` removes what it left. Scenarios that kill or interrupt run
in a child process with a timeout."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from _child import SIGINT_HANDLER, child_env, explain, leftovers_fixture, run_script, shm_names, spawn  # noqa: E402

from fastcopy.torch import SEGMENT_PREFIX, Loader, WorkerError  # noqa: E402

# What this pytest process's Loaders name their segments (removed, and failed on, after each test).
MINE = f"{SEGMENT_PREFIX}{os.getpid()}-"
no_leftover_segments = leftovers_fixture(MINE, fail=True)


class Mixed(torch.utils.data.Dataset):
    """Samples of a numpy array, a number, and a dict of a tensor and a float."""

    def __init__(self, n: int = 37) -> None:
        rng = np.random.default_rng(0)
        self.x = [rng.random((3, 5)).astype(np.float32) for _ in range(n)]

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        return self.x[i], i, {"t": torch.tensor([i, -i]), "f": i / 2}


def _same(a, b) -> None:
    if isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            _same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _same(x, y)
    else:
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b), (a, b)


def _compare(shuffle: bool, **kw) -> None:
    ds = Mixed()
    ref = torch.utils.data.DataLoader(ds, batch_size=4, num_workers=2, shuffle=shuffle,
                                      generator=torch.Generator().manual_seed(7) if shuffle else None, **kw)
    ours = Loader(ds, batch_size=4, num_workers=2, shuffle=shuffle,
                  generator=torch.Generator().manual_seed(7) if shuffle else None, timeout=60, **kw)
    got = list(ours)
    want = list(ref)
    assert len(got) == len(want) == len(ours)
    for a, b in zip(want, got):
        _same(a, b)


def test_same_batches_as_dataloader_in_order():
    _compare(False)


def test_same_batches_as_dataloader_shuffled_with_a_generator():
    _compare(True, drop_last=True)


def test_batches_are_writable_tensors_that_hold_their_slot():
    ds = Mixed(16)
    it = iter(Loader(ds, batch_size=8, num_workers=1, timeout=60))
    x, _, _ = next(it)
    x += 1  # a copy-on-write view: writable, private to this process
    assert torch.allclose(x - 1, torch.from_numpy(np.stack(ds.x[:8])))
    rest = list(it)
    assert len(rest) == 1
    assert torch.equal(rest[0][0], torch.from_numpy(np.stack(ds.x[8:])))


class Raising(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 20

    def __getitem__(self, i: int):
        if i == 13:
            raise KeyError(f"no sample {i}")
        return np.full(4, i)


def test_worker_exception_surfaces_naming_the_worker():
    with pytest.raises(WorkerError) as e:
        for _ in Loader(Raising(), batch_size=2, num_workers=2, timeout=60):
            pass
    text = str(e.value)
    # Index 13 is in batch 6, which worker 0 makes (batches go round-robin).
    assert "worker 0" in text and "KeyError" in text and "no sample 13" in text and "batch 6" in text


def _failing_init(worker_id: int) -> None:
    if worker_id == 1:
        raise OSError("cannot open the shards")


def test_worker_init_fn_exception_surfaces():
    with pytest.raises(WorkerError) as e:
        for _ in Loader(Raising(), batch_size=2, num_workers=2, timeout=60, worker_init_fn=_failing_init):
            pass
    text = str(e.value)
    assert "worker 1" in text and "OSError in worker_init_fn" in text and "cannot open the shards" in text


KILLED_WORKER = SIGINT_HANDLER + """
import os, signal, sys
import numpy as np, torch
from fastcopy.torch import Loader, WorkerError

class DS(torch.utils.data.Dataset):
    def __len__(self): return 40
    def __getitem__(self, i):
        if i == 10:
            os.kill(os.getpid(), signal.SIGKILL)
        return np.zeros(8)

try:
    for _ in Loader(DS(), batch_size=2, num_workers=2):
        pass
except WorkerError as e:
    print("ERROR", e)
left = [n for n in os.listdir("/dev/shm") if n.startswith(f"fastcopy-torch-{os.getpid()}-")]
print("LEFT", left)
"""


def test_worker_sigkill_surfaces_without_a_hang(tmp_path):
    proc = run_script(tmp_path, KILLED_WORKER, timeout=120)
    assert proc.returncode == 0, explain(proc)
    # Index 10 is in batch 5, which worker 1 makes.
    assert "ERROR worker 1" in proc.stdout and "died: killed by SIGKILL" in proc.stdout, explain(proc)
    assert "LEFT []" in proc.stdout, explain(proc)


KILLED_AT_START = SIGINT_HANDLER + """
import os, signal
import numpy as np, torch
from fastcopy.torch import Loader, WorkerError

def die(worker_id):
    if worker_id == 1:
        os.kill(os.getpid(), signal.SIGKILL)

try:
    for _ in Loader([np.zeros(3)] * 8, batch_size=2, num_workers=2, worker_init_fn=die):
        pass
except WorkerError as e:
    print("ERROR", e)
"""


def test_worker_killed_before_its_first_batch_surfaces(tmp_path):
    # The worker dies before it is the producer of its channel: the wait sees its process end.
    # The script ends in about 2 s; the bound only stops a wait that never ends.
    proc = run_script(tmp_path, KILLED_AT_START, timeout=20)
    assert proc.returncode == 0, explain(proc)
    assert "ERROR worker 1" in proc.stdout and "killed by SIGKILL" in proc.stdout, explain(proc)


INTERRUPTED = SIGINT_HANDLER + """
import multiprocessing, os, sys, time
import numpy as np, torch
from fastcopy.torch import Loader

class Slow(torch.utils.data.Dataset):
    def __len__(self): return 10000
    def __getitem__(self, i):
        time.sleep(0.01)
        return np.zeros(1000, np.float32)

for n, batch in enumerate(Loader(Slow(), batch_size=4, num_workers=2)):
    if n == 0:
        print("WORKERS", *[p.pid for p in multiprocessing.active_children()], flush=True)
"""


def _gone(pid: int, within: float) -> bool:
    end = time.monotonic() + within
    while time.monotonic() < end:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().split(") ")[-1].startswith("Z"):
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.05)
    return False


def _worker_pids(proc) -> list:
    line = proc.stdout.readline()
    assert line.startswith("WORKERS"), line + proc.stderr.read()
    pids = [int(p) for p in line.split()[1:]]
    assert len(pids) == 2, line
    return pids


def test_ctrl_c_stops_the_workers_and_removes_the_segments():
    proc = spawn(INTERRUPTED)
    try:
        pids = _worker_pids(proc)
        prefix = f"{SEGMENT_PREFIX}{proc.pid}-"
        assert len(shm_names(prefix)) == 4  # an index and a data channel per worker
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "KeyboardInterrupt" in err, err
    assert all(_gone(p, 10) for p in pids)
    assert shm_names(prefix) == set()


def test_main_sigkill_leaves_segments_that_shm_clean_removes():
    proc = spawn(INTERRUPTED)
    try:
        pids = _worker_pids(proc)
        prefix = f"{SEGMENT_PREFIX}{proc.pid}-"
        proc.kill()
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert len(shm_names(prefix)) == 4
    # The workers see their consumer die and end by themselves.
    assert all(_gone(p, 30) for p in pids)
    clean = subprocess.run([sys.executable, "-m", "fastcopy", "shm", "--clean", "--prefix", prefix],
                           capture_output=True, text=True, timeout=60, env=child_env())
    assert clean.returncode == 0, explain(clean)
    assert shm_names(prefix) == set(), explain(clean)


def test_import_fastcopy_does_not_import_torch():
    code = "import sys, fastcopy, fastcopy.shm; print('torch' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env=child_env())
    assert proc.returncode == 0 and proc.stdout.strip() == "False", explain(proc)


def test_missing_torch_names_the_extra(tmp_path):
    # A torch that cannot be imported: a module of that name that raises ImportError.
    (tmp_path / "torch.py").write_text("raise ImportError('no torch here')\n")
    env = child_env()
    env["PYTHONPATH"] = str(tmp_path) + os.pathsep + env["PYTHONPATH"]
    proc = subprocess.run([sys.executable, "-c", "import fastcopy.torch"], capture_output=True, text=True,
                          timeout=60, env=env)
    assert proc.returncode != 0 and "fastcopy[torch]" in proc.stderr, explain(proc)
