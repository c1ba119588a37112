"""A daemon's heap settings (rota.wire.lifetime.lean_heap), checked in a process of their own."""
import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.fast

PROBE = """
import ctypes
from rota.wire.lifetime import lean_heap
assert lean_heap()
big = bytearray(1 << 20); del big            # freed: glibc would now raise its threshold to 1 MiB
libc = ctypes.CDLL(None)
class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                "fsmblks", "uordblks", "fordblks", "keepcost")]
libc.mallinfo2.restype = Info
def mapped_after(size):
    keep = bytearray(size)
    return libc.mallinfo2().hblks
before = libc.mallinfo2().hblks
assert mapped_after(512 * 1024) > before, "a 512 KiB block after a 1 MiB one was freed: from the heap, not mapped"
print("ok")
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt's settings are glibc's")
def test_a_daemons_heap_maps_large_blocks_whatever_it_freed_before():
    r = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout + r.stderr
