"""Key files: the cluster key (``rota keygen``; ``rota up`` makes one for a single box) and the host
keys derived from it. Like munged, rota refuses a key file anyone but the service user could read
or write, and says exactly how to fix it."""
from __future__ import annotations

import os
import stat

from rota.core import credentials

MIN_KEY, MAX_KEY = 32, 1024
DEFAULT_KEY_BYTES = 128            # mungekey's default
HOST_KEY_TAG = "rota-host-key"


class KeyFileError(Exception):
    """A key file that is missing, malformed or insecure; ``fix`` is the command that repairs it."""

    def __init__(self, message: str, fix: str = "") -> None:
        super().__init__(message + (f"\n  fix: {fix}" if fix else ""))
        self.message, self.fix = message, fix


def _owner_name(uid: int) -> str:
    import pwd

    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _check_secure(path: str, uid: int) -> None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise KeyFileError(f'Failed to find keyfile "{path}"', f"rota keygen {path}") from None
    except OSError as exc:
        raise KeyFileError(f'Failed to check keyfile "{path}": {exc.strerror}') from None
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISREG(st.st_mode):
        raise KeyFileError(f'Keyfile is insecure: "{path}" should be a regular file (not a link)',
                           f"replace it with the file itself: cp --remove-destination \"$(readlink -f {path})\" {path}")
    if st.st_uid != uid:
        raise KeyFileError(f'Keyfile is insecure: "{path}" should be owned by UID {uid} instead of UID {st.st_uid}',
                           f"chown {_owner_name(uid)} {path}")
    if st.st_mode & 0o077:
        raise KeyFileError(f'Keyfile is insecure: "{path}" should not be readable or writable by group or others '
                           f"(perms={stat.S_IMODE(st.st_mode):04o})", f"chmod 600 {path}")


def _read(path: str) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as fh:
        return fh.read(MAX_KEY * 4 + 256)


def load_cluster_key(path: str, uid: int | None = None) -> bytes:
    """The cluster key in ``path``, refused unless it is a private regular file owned by ``uid``
    (default: the user running this process)."""
    _check_secure(path, os.geteuid() if uid is None else uid)
    data = _read(path)
    if data.startswith(HOST_KEY_TAG.encode()):
        raise KeyFileError(f'"{path}" is a host key, not the cluster key', "give the cluster key (rota keygen)")
    if not MIN_KEY <= len(data) <= MAX_KEY:
        raise KeyFileError(f'Keyfile "{path}" holds {len(data)} bytes; a key has {MIN_KEY} to {MAX_KEY}',
                           f"rota keygen --force {path}")
    return data


def write_private(path: str, data: bytes, *, exclusive: bool = True) -> None:
    """Write ``data`` to a new file readable and writable by its owner only."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | (os.O_EXCL if exclusive else os.O_TRUNC)
    fd = os.open(path, flags, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, data)
    finally:
        os.close(fd)


def generate(path: str, size: int = DEFAULT_KEY_BYTES, *, force: bool = False) -> None:
    """``rota keygen``: a new random cluster key, mode 0600 (never overwriting one unless ``force``)."""
    if not MIN_KEY <= size <= MAX_KEY:
        raise KeyFileError(f"a key has {MIN_KEY} to {MAX_KEY} bytes, not {size}")
    if force and os.path.lexists(path):
        os.unlink(path)
    write_private(path, os.urandom(size))


def write_host_key(path: str, cluster_key: bytes, host: str) -> None:
    """The key file a host's agent or signer uses: only that host's derived key."""
    if not credentials.valid_host(host):
        raise KeyFileError(f"{host!r} is not a usable host name (letters, digits, '_' and '-')")
    text = f"{HOST_KEY_TAG} {host} {credentials.host_key(cluster_key, host).hex()}\n"
    write_private(path, text.encode())


class Keyring:
    """The keys this process holds: the cluster key (derives every host's) or one host's key."""

    def __init__(self, cluster_key: bytes | None = None, host: str | None = None,
                 host_key: bytes | None = None) -> None:
        self.cluster_key, self.host, self._host_key = cluster_key, host, host_key
        self._cache: dict[str, bytes] = {}

    @property
    def is_cluster(self) -> bool:
        return self.cluster_key is not None

    def key_of(self, host: str) -> bytes | None:
        """The key ``host`` signs with, when this keyring can know it."""
        if self.cluster_key is not None:
            key = self._cache.get(host)
            if key is None:
                key = self._cache[host] = credentials.host_key(self.cluster_key, host)
            return key
        return self._host_key if host == self.host else None

    def purpose_key(self, purpose: str) -> bytes | None:
        """A cluster-wide derived key (the log's MACs, the controller's NATS password)."""
        return credentials.derived_key(self.cluster_key, purpose) if self.cluster_key is not None else None


def load_keyring(path: str, host: str | None = None, uid: int | None = None) -> Keyring:
    """A cluster key file, or a host key file (which must be ``host``'s when a host is given)."""
    _check_secure(path, os.geteuid() if uid is None else uid)
    data = _read(path)
    if data.startswith(HOST_KEY_TAG.encode()):
        parts = data.decode("ascii", "replace").split()
        if len(parts) != 3 or not credentials.valid_host(parts[1]) or len(parts[2]) != 64:
            raise KeyFileError(f'"{path}" is not a host key file', f"rota keygen --host NAME --out {path}")
        if host is not None and parts[1] != host:
            raise KeyFileError(f'"{path}" is the key of host {parts[1]}, not of {host}',
                               f"rota keygen --host {host} --out {path}")
        try:
            return Keyring(host=parts[1], host_key=bytes.fromhex(parts[2]))
        except ValueError:
            raise KeyFileError(f'"{path}" is not a host key file') from None
    return Keyring(cluster_key=load_cluster_key(path, uid))
