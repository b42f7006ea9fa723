"""Runs cases in worker subprocesses and appends their records to a JSONL file.

A worker (`python -m torch_pjrt.models worker`) reads one request per line on stdin ({"zoo",
"name"}), runs it with compare.run_case and answers one line on its private result pipe (the
original stdout; the model's own prints go to stderr). The driver gives each case a timeout: a
case that runs past it, or a worker that dies (a crash, an abort, a signal), becomes an `error`
record naming that, and a fresh worker takes the next case. Workers are also replaced after every
error (a failed op may leave state behind) and after `per_worker` cases, so one model's leftovers
cannot decide another's result.

Records are appended (one JSON object per line, flushed) as they finish, so an interrupted sweep
resumes where it stopped (`resume=True` skips every (zoo, name) already in the file).
"""
from __future__ import annotations

import json
import os
import queue
import selectors
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Dict, Iterable, List, Optional, Tuple

RESULT_PREFIX = "@@torch_pjrt.models@@ "
# live workers of this driver: killed when it exits or is terminated (each is in its own session,
# so a driver that died would otherwise leave them running their current model)
_LIVE: "set[Worker]" = set()
_LIVE_LOCK = threading.Lock()


_STOPPING = threading.Event()  # set on interrupt: results of killed workers are not recorded


def kill_live_workers() -> None:
    _STOPPING.set()
    with _LIVE_LOCK:
        live = list(_LIVE)
    for w in live:
        w.close(kill=True)


def _versions() -> Dict[str, str]:
    out = {}
    import importlib.metadata as md
    for pkg in ("torch", "transformers", "timm", "torchvision", "diffusers"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            pass
    return out


def load_records(path: str) -> List[dict]:
    recs = []
    if not os.path.exists(path):
        return recs
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                recs.append(json.loads(line))
            except json.JSONDecodeError:  # a line cut short by a kill: ignored, rerun on resume
                continue
    return recs


def worker_threads(jobs: int) -> int:
    """CPU threads each of `jobs` workers gets: the machine's cores shared out, at least one."""
    return max(1, (os.cpu_count() or 1) // max(1, jobs))


def thread_env(threads: int) -> Dict[str, str]:
    """A worker's OpenMP settings. PyTorch's CPU kernels run in libgomp parallel regions whose
    waiting threads spin; when the machine has more runnable threads than cores (two workers
    with the default thread count each, or any other process), a region ends only when its
    descheduled thread gets a core back, a whole scheduler slice later. Measured on 2 cores with
    another process busy: torchvision's efficientnet_b0 float64 forward+backward (96 grouped
    convolutions, each a parallel region per group) took 80-104 s with 2 spinning threads,
    0.33 s with passive waiting, 0.17 s with one thread. A worker therefore gets its share of
    the cores and waits passively; values the caller's environment sets are kept."""
    return {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", str(threads)),
            "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE")}


class Worker:
    def __init__(self, eager_mode: str, log_dir: str, mode: str = "eager", threads: int = 1):
        self.log = tempfile.NamedTemporaryFile("w+", prefix="worker-", suffix=".log", dir=log_dir,
                                               delete=False)
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
               "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
               "PYTHONUNBUFFERED": "1", **thread_env(threads)}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "torch_pjrt.models", "worker", "--eager-mode", eager_mode,
             "--mode", mode],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, env=env,
            text=True, bufsize=1, start_new_session=True)
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.proc.stdout, selectors.EVENT_READ)
        self.done = 0
        with _LIVE_LOCK:
            _LIVE.add(self)

    def ask(self, zoo: str, name: str, timeout: float) -> Tuple[Optional[dict], str]:
        """(record, "") or (None, why it did not come back)."""
        try:
            self.proc.stdin.write(json.dumps({"zoo": zoo, "name": name}) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            return None, self._death()
        deadline = time.time() + timeout
        while True:
            left = deadline - time.time()
            if left <= 0:
                return None, f"timeout: no result after {timeout:.0f} s"
            if not self.sel.select(timeout=min(left, 5.0)):
                if self.proc.poll() is not None:
                    return None, self._death()
                continue
            line = self.proc.stdout.readline()
            if not line:
                return None, self._death()
            if line.startswith(RESULT_PREFIX):
                self.done += 1
                return json.loads(line[len(RESULT_PREFIX):]), ""

    def _death(self) -> str:
        try:
            rc = self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            rc = None
        tail = self.stderr_tail()
        if rc is not None and rc < 0:
            try:
                sig = signal.Signals(-rc).name
            except ValueError:
                sig = str(-rc)
            what = f"worker killed by {sig}"
        else:
            what = f"worker exited with status {rc}"
        return f"crash: {what}" + (f"; last stderr: {tail}" if tail else "")

    def stderr_tail(self, lines: int = 3) -> str:
        try:
            self.log.flush()
            with open(self.log.name, encoding="utf-8", errors="replace") as f:
                text = [x.strip() for x in f.read()[-4000:].splitlines() if x.strip()]
            return " | ".join(text[-lines:])[:500]
        except OSError:
            return ""

    def close(self, kill: bool = False) -> None:
        try:
            if kill or self.proc.poll() is None:
                if not kill:
                    try:
                        self.proc.stdin.close()
                        self.proc.wait(timeout=20)
                    except (OSError, subprocess.TimeoutExpired):
                        kill = True
                if kill and self.proc.poll() is None:
                    os.killpg(self.proc.pid, signal.SIGKILL)  # its own session: only its tree
                    self.proc.wait(timeout=20)
        except (OSError, subprocess.TimeoutExpired):
            pass
        finally:
            with _LIVE_LOCK:
                _LIVE.discard(self)
            self.sel.close()
            self.log.close()
            try:
                os.unlink(self.log.name)
            except OSError:
                pass


def run_all(todo: Iterable[Tuple[str, str]], out_path: str, jobs: int = 2, timeout: float = 300,
            per_worker: int = 25, eager_mode: str = "strict", progress=print,
            mode: str = "eager") -> List[dict]:
    """Runs every (zoo, name) in `todo` on `jobs` workers, appending each record to `out_path`.
    `mode`: "eager" (the model run op by op under `eager_mode`) or "compile" (compare.py's
    compiled mode; ops outside the compiled graphs run under `eager_mode`)."""
    todo = list(todo)
    q: "queue.Queue[Tuple[int, str, str]]" = queue.Queue()
    for i, (zoo, name) in enumerate(todo):
        q.put((i, zoo, name))
    lock = threading.Lock()
    results: List[dict] = []
    versions = _versions()
    os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
    log_dir = tempfile.mkdtemp(prefix="torch_pjrt_models_")
    t_start = time.time()

    def write(rec: dict) -> None:
        rec.setdefault("versions", versions)
        rec["eager_mode"] = eager_mode
        rec["mode"] = mode
        with lock:
            with open(out_path, "a", encoding="utf-8") as f:
                f.write(json.dumps(rec, sort_keys=True) + "\n")
            results.append(rec)
            n = len(results)
            progress(f"[{n}/{len(todo)} {time.time() - t_start:.0f}s] {rec['zoo']}/{rec['name']}: "
                     f"{rec['status']}" + (f" ({rec['reason'][:160]})" if rec.get("reason") else ""))

    def loop() -> None:
        worker: Optional[Worker] = None
        try:
            while True:
                if _STOPPING.is_set():
                    return
                try:
                    _, zoo, name = q.get_nowait()
                except queue.Empty:
                    return
                if worker is None:
                    worker = Worker(eager_mode, log_dir, mode, worker_threads(jobs))
                t0 = time.time()
                rec, why = worker.ask(zoo, name, timeout)
                if _STOPPING.is_set():
                    return
                if rec is None:
                    rec = {"zoo": zoo, "name": name, "status": "error", "phase": "worker", "phases": {},
                           "reason": why, "seconds": round(time.time() - t0, 2)}
                    worker.close(kill=True)
                    worker = None
                elif rec["status"] == "error" or worker.done >= per_worker:
                    worker.close()
                    worker = None
                write(rec)
        finally:
            if worker is not None:
                worker.close()

    threads = [threading.Thread(target=loop, daemon=True) for _ in range(max(1, jobs))]
    old_term = signal.getsignal(signal.SIGTERM)

    def on_term(signum, frame):
        raise KeyboardInterrupt

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, on_term)
    try:
        for t in threads:
            t.start()
        for t in threads:
            while t.is_alive():
                t.join(timeout=1.0)
    except KeyboardInterrupt:
        progress("interrupted: killing the workers; rerun with --resume to continue")
        kill_live_workers()
        raise
    finally:
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, old_term)
    try:
        os.rmdir(log_dir)
    except OSError:
        pass
    return results


def serve(eager_mode: str, mode: str = "eager") -> None:
    """The worker's loop: requests on stdin, records on the original stdout."""
    result_fd = os.dup(1)
    os.dup2(2, 1)  # anything the models print goes to stderr, never into the result stream
    sys.stdout = sys.stderr
    results = os.fdopen(result_fd, "w", buffering=1, encoding="utf-8")
    import torch
    import torch_pjrt  # noqa: F401  (registers the tpu device)
    torch.tpu.set_eager_mode(eager_mode)
    from . import zoos
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        req = json.loads(line)
        rec = zoos.run_one(req["zoo"], req["name"], mode)
        results.write(RESULT_PREFIX + json.dumps(rec) + "\n")
        results.flush()
