"""System V semaphores and shared memory through the C library (``ctypes``), for ``host://``.

Why the standard library and not a package: the kernel's ``semtimedop`` is what bounds every
wait, and the published Linux wheels of ``sysv_ipc`` (1.2.0) are built without it, so there
every timed wait of that package waits forever (its documentation says so); ``posix_ipc``
semaphores have no ``SEM_UNDO``, so a killed process would keep its slots. Eight libc calls
with fixed, portable argument layouts (``struct sembuf``, ``struct timespec``) need no package.

Linux only (``semtimedop``); elsewhere :func:`libc` raises :class:`OSError` naming the need.
Every failure is an :class:`OSError` with the call's ``errno``; callers wrap it once.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import sys
import time
from typing import Final

__all__ = [
    "GETNCNT",
    "GETVAL",
    "IPC_CREAT",
    "IPC_NOWAIT",
    "SEM_UNDO",
    "SETVAL",
    "Lib",
    "Ops",
    "libc",
]

IPC_CREAT: Final = 0o1000
IPC_EXCL: Final = 0o2000
IPC_NOWAIT: Final = 0o4000
IPC_RMID: Final = 0
SEM_UNDO: Final = 0x1000
GETVAL: Final = 12
GETNCNT: Final = 14
SETVAL: Final = 16


_SLICE: Final = 3600.0
"""Seconds of one kernel wait: a longer ``timeout`` (``inf``: the caller set no bound but its
deadline) waits slice after slice, since a ``timespec`` holds no infinity."""


class _Sembuf(ctypes.Structure):
    _fields_ = (
        ("sem_num", ctypes.c_ushort),
        ("sem_op", ctypes.c_short),
        ("sem_flg", ctypes.c_short),
    )


class _Timespec(ctypes.Structure):
    _fields_ = (("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long))


class Ops:
    """A prepared ``semop`` argument: ``[(sem_num, sem_op, flags), ...]`` applied atomically.

    Built once per use (a slot's take and give), so the hot path passes a ready pointer.
    """

    __slots__ = ("_array", "count", "ref")

    def __init__(self, ops: list[tuple[int, int, int]]) -> None:
        self._array = (_Sembuf * len(ops))(*(_Sembuf(n, op, flags) for n, op, flags in ops))
        self.count = len(ops)
        self.ref = ctypes.byref(self._array)


class Lib:
    """The libc functions ``host://`` calls, each raising :class:`OSError` on failure."""

    def __init__(self) -> None:
        if not sys.platform.startswith("linux"):
            raise OSError(
                errno.ENOSYS, f"host:// stores need Linux (semtimedop), not {sys.platform}"
            )
        path = ctypes.util.find_library("c")
        lib = ctypes.CDLL(path, use_errno=True)
        self.semget = lib.semget
        self.semop = lib.semop
        """Raw ``semop(id, ops.ref, ops.count)``: 0 or -1 (``ctypes.get_errno()``); the hot
        path calls it directly and reads ``errno`` only on failure."""
        self._semtimedop = lib.semtimedop
        self._semctl = lib.semctl
        self._shmget = lib.shmget
        self._shmat = lib.shmat
        self._shmat.restype = ctypes.c_void_p
        self._shmat.argtypes = (ctypes.c_int, ctypes.c_void_p, ctypes.c_int)
        self._shmdt = lib.shmdt
        self._shmdt.argtypes = (ctypes.c_void_p,)
        self._shmctl = lib.shmctl
        self._shmctl.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_void_p)

    @staticmethod
    def _check(rc: int, call: str) -> int:
        if rc == -1:
            code = ctypes.get_errno()
            raise OSError(code, f"{call}: {os.strerror(code)}")
        return rc

    def sem_open(self, key: int, nsems: int, mode: int) -> int:
        """The id of the semaphore set at ``key`` (created with all values 0 if absent)."""
        return self._check(self.semget(key, nsems, IPC_CREAT | mode), "semget")

    def sem_find(self, key: int) -> int | None:
        """The id of the existing set at ``key``, or ``None``."""
        rc = self.semget(key, 0, 0)
        if rc == -1:
            code = ctypes.get_errno()
            if code == errno.ENOENT:
                return None
            raise OSError(code, f"semget: {os.strerror(code)}")
        return int(rc)

    def semop_timed(self, semid: int, ops: Ops, timeout: float | None) -> bool:
        """Apply ``ops``, waiting at most ``timeout`` seconds (``None``: no wait at all, the
        ops must carry ``IPC_NOWAIT``; ``inf``: no bound); False when it ran out (``EAGAIN``).
        Retries after a signal (``EINTR``) with the time left."""
        if timeout is None:
            if self.semop(semid, ops.ref, ops.count) == 0:
                return True
            code = ctypes.get_errno()
            if code == errno.EAGAIN:
                return False
            raise OSError(code, f"semop: {os.strerror(code)}")
        end = time.monotonic() + timeout
        spec = _Timespec()
        while True:
            left = min(_SLICE, max(0.0, end - time.monotonic()))
            spec.tv_sec = int(left)
            spec.tv_nsec = int((left - int(left)) * 1e9)
            if self._semtimedop(semid, ops.ref, ops.count, ctypes.byref(spec)) == 0:
                return True
            code = ctypes.get_errno()
            if code == errno.EAGAIN:
                if left == _SLICE and time.monotonic() < end:
                    continue  # one slice of a longer (or unbounded) wait ran out
                return False
            if code != errno.EINTR:
                raise OSError(code, f"semtimedop: {os.strerror(code)}")

    def semctl(self, semid: int, num: int, cmd: int, value: int = 0) -> int:
        """``semctl`` for the integer commands (``GETVAL``, ``GETNCNT``, ``SETVAL``)."""
        return self._check(self._semctl(semid, num, cmd, ctypes.c_int(value)), "semctl")

    def sem_remove(self, semid: int) -> None:
        self._check(self._semctl(semid, 0, IPC_RMID, ctypes.c_int(0)), "semctl(IPC_RMID)")

    def shm_open(self, key: int, size: int, mode: int) -> int:
        """The id of the shared memory segment at ``key`` (created zero-filled if absent)."""
        return self._check(self._shmget(key, ctypes.c_size_t(size), IPC_CREAT | mode), "shmget")

    def shm_find(self, key: int) -> int | None:
        rc = self._shmget(key, ctypes.c_size_t(0), 0)
        if rc == -1:
            code = ctypes.get_errno()
            if code == errno.ENOENT:
                return None
            raise OSError(code, f"shmget: {os.strerror(code)}")
        return int(rc)

    def shm_attach(self, shmid: int, size: int) -> tuple[int, memoryview]:
        """Map the segment: its address and a writable byte view of ``size`` bytes."""
        address = self._shmat(shmid, None, 0)
        if address is None or address == ctypes.c_void_p(-1).value:
            code = ctypes.get_errno()
            raise OSError(code, f"shmat: {os.strerror(code)}")
        view = memoryview((ctypes.c_char * size).from_address(address)).cast("B")
        return address, view

    def shm_detach(self, address: int) -> None:
        self._check(self._shmdt(address), "shmdt")

    def shm_remove(self, shmid: int) -> None:
        self._check(self._shmctl(shmid, IPC_RMID, None), "shmctl(IPC_RMID)")


_LIB: Lib | None = None


def libc() -> Lib:
    """The process's one :class:`Lib` (loaded on first use)."""
    global _LIB  # noqa: PLW0603 - one binding per process, loaded lazily
    if _LIB is None:
        _LIB = Lib()
    return _LIB
