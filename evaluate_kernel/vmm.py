"""GPU memory shared by file descriptor (CUDA's virtual memory management), for the GPU's timed batches.

Guarantees: the reference worker makes every region (cuMemCreate, pinned device memory, exportable as a
POSIX file descriptor) and keeps it mapped; the parent, which never touches CUDA, takes the descriptor from
it (pidfd_getfd: the parent is its ancestor) and sends it to the runner an evaluation takes, on a socket
the runner holds from its start (a region exists only while a runner is timed). The runner maps the same memory, also from inside its PID, mount, network and
IPC namespaces, where CUDA's IPC handles do not reach. So the reference worker writes a batch's inputs
into the runner's memory and reads its outputs from there, with the runner stopped, as the CPU protocol
does through a memfd and /proc/PID/mem (host_batches.py).

In the runner, a batch's allocations go to a torch MemPool whose allocator hands out pieces of the region
above its input area: whatever torch allocates in the calls (outputs, and the temporaries they reuse)
lies in memory the reference worker can read. An output allocated any other way lies outside and is
refused by the claim's check (readout.claim).

Only the driver's entry points through ctypes: nothing compiled, no library beyond torch.
"""
from __future__ import annotations

import ctypes
import os

POSIX_FD = 1          # CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
PINNED = 1            # CU_MEM_ALLOCATION_TYPE_PINNED
LOCATION_DEVICE = 1   # CU_MEM_LOCATION_TYPE_DEVICE
READ_WRITE = 3        # CU_MEM_ACCESS_FLAGS_PROT_READWRITE
ALIGN = 512           # every piece the pool gets starts on this boundary


class Region:
    """Device memory mapped into this process: made here (make) or from another's descriptor (open)."""

    def __init__(self, handle: int, ptr: int, size: int, fd: int = -1):
        self.handle, self.ptr, self.size, self.fd = handle, ptr, size, fd
        self._tensor = None

    @classmethod
    def make(cls, size: int, device: int) -> "Region":
        """(Reference worker.) New memory of at least `size` bytes on the device, mapped here, and a
        descriptor for it (self.fd) that others can map."""
        lib, prop = _driver(), _prop(device)
        gran = ctypes.c_size_t()
        _ck(lib.cuMemGetAllocationGranularity(ctypes.byref(gran), ctypes.byref(prop), 0), "granularity")
        size = -(-size // gran.value) * gran.value
        handle = ctypes.c_uint64()
        _ck(lib.cuMemCreate(ctypes.byref(handle), ctypes.c_size_t(size), ctypes.byref(prop), ctypes.c_uint64(0)),
            "cuMemCreate")
        try:
            ptr = _map(lib, handle, size, device)
            fd = ctypes.c_int(-1)
            _ck(lib.cuMemExportToShareableHandle(ctypes.byref(fd), handle, POSIX_FD, ctypes.c_uint64(0)), "export")
        except BaseException:
            lib.cuMemRelease(handle)
            raise
        return cls(handle.value, ptr, size, fd.value)

    @classmethod
    def open(cls, fd: int, size: int, device: int) -> "Region":
        """(Runner.) The memory behind another process's descriptor (closed here), mapped here."""
        lib = _driver()
        handle = ctypes.c_uint64()
        try:
            _ck(lib.cuMemImportFromShareableHandle(ctypes.byref(handle), ctypes.c_void_p(fd), POSIX_FD), "import")
        finally:
            os.close(fd)   # the handle holds the memory now
        return cls(handle.value, _map(lib, handle, size, device), size)

    @property
    def bytes(self):
        """The whole region as a 1-D uint8 CUDA tensor (a view: no copy)."""
        if self._tensor is None:
            import torch
            self._tensor = torch.as_tensor(_Raw(self.ptr, self.size), device="cuda")
        return self._tensor

    def close(self) -> None:
        """Unmap and release; the memory goes once every process that mapped it has let go."""
        lib = _driver()
        self._tensor = None
        lib.cuMemUnmap(ctypes.c_uint64(self.ptr), ctypes.c_size_t(self.size))
        lib.cuMemAddressFree(ctypes.c_uint64(self.ptr), ctypes.c_size_t(self.size))
        lib.cuMemRelease(ctypes.c_uint64(self.handle))
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class Pool:
    """(Runner.) A torch MemPool over region[start:], its pieces handed out by FreeRanges."""

    def __init__(self, region: Region, start: int):
        import torch
        self.ranges = ranges = FreeRanges(region.ptr + start, region.ptr + region.size)
        alloc_t = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p)
        free_t = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p)
        # Held here: torch keeps only the pointers. The callbacks hold the ranges themselves, not this
        # object, whose attributes may be gone when torch gives its segments back at exit.
        self._alloc = alloc_t(lambda size, device, stream: ranges.take(size))
        self._free = free_t(lambda ptr, size, device, stream: ranges.give(ptr, size))
        allocator = torch._C._cuda_customAllocator(ctypes.cast(self._alloc, ctypes.c_void_p).value,
                                                   ctypes.cast(self._free, ctypes.c_void_p).value)
        self.pool = torch.cuda.MemPool(allocator)


class FreeRanges:
    """The free part of [lo, hi): first fit, split, neighbours merged; every piece aligned to ALIGN. The
    caching allocator above asks for segments and gives them back only to retry an allocation that failed
    (segments it has cached but holds nothing in)."""

    def __init__(self, lo: int, hi: int):
        lo = -(-lo // ALIGN) * ALIGN
        self.free = [(lo, hi - lo)] if hi > lo else []   # (address, bytes), by address

    def take(self, size: int) -> int | None:
        size = -(-max(size, 1) // ALIGN) * ALIGN
        for k, (at, room) in enumerate(self.free):
            if room >= size:
                self.free[k:k + 1] = [(at + size, room - size)] if room > size else []
                return at
        return None   # torch then raises its out-of-memory error

    def give(self, ptr: int | None, size: int) -> None:
        if not ptr:
            return
        self.free.append((ptr, -(-max(size, 1) // ALIGN) * ALIGN))
        self.free.sort()
        merged = [self.free[0]]
        for at, room in self.free[1:]:
            last_at, last_room = merged[-1]
            if last_at + last_room == at:
                merged[-1] = (last_at, last_room + room)
            else:
                merged.append((at, room))
        self.free = merged


def pidfd_getfd(pid: int, fd: int) -> int:
    """A copy of descriptor `fd` of process `pid` (Linux 5.6; the caller must be allowed to trace it)."""
    libc = ctypes.CDLL(None, use_errno=True)
    pidfd = os.pidfd_open(pid)
    try:
        got = libc.syscall(438, pidfd, fd, 0)   # SYS_pidfd_getfd, the same number on every architecture
    finally:
        os.close(pidfd)
    if got < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"pidfd_getfd: {os.strerror(err)}")
    os.set_inheritable(got, False)
    return got


# ------------------------------------------------------------------------------------------ the driver
class _Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class _AllocFlags(ctypes.Structure):
    _fields_ = [("compressionType", ctypes.c_ubyte), ("gpuDirectRDMACapable", ctypes.c_ubyte),
                ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]


class _Prop(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int), ("location", _Location),
                ("win32HandleMetaData", ctypes.c_void_p), ("allocFlags", _AllocFlags)]


class _Access(ctypes.Structure):
    _fields_ = [("location", _Location), ("flags", ctypes.c_int)]


class _Raw:
    """Raw device memory as torch.as_tensor reads it (__cuda_array_interface__)."""

    def __init__(self, ptr: int, size: int):
        self.__cuda_array_interface__ = {"shape": (size,), "typestr": "|u1", "data": (ptr, False), "version": 3}


def _driver():
    return ctypes.CDLL("libcuda.so.1")


def _prop(device: int) -> _Prop:
    p = _Prop()
    p.type, p.requestedHandleTypes = PINNED, POSIX_FD
    p.location = _Location(LOCATION_DEVICE, device)
    return p


def _map(lib, handle, size: int, device: int) -> int:
    ptr = ctypes.c_uint64()
    _ck(lib.cuMemAddressReserve(ctypes.byref(ptr), ctypes.c_size_t(size), ctypes.c_size_t(0), ctypes.c_uint64(0),
                                ctypes.c_uint64(0)), "reserve")
    _ck(lib.cuMemMap(ptr, ctypes.c_size_t(size), ctypes.c_size_t(0), handle, ctypes.c_uint64(0)), "map")
    access = _Access(_Location(LOCATION_DEVICE, device), READ_WRITE)
    _ck(lib.cuMemSetAccess(ptr, ctypes.c_size_t(size), ctypes.byref(access), ctypes.c_size_t(1)), "access")
    return ptr.value


def _ck(result: int, what: str) -> None:
    if result != 0:
        raise RuntimeError(f"CUDA driver: {what} failed (CUresult {result})")
