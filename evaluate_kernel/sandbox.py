"""Parent side: what keeps a candidate's processes from reaching beyond their own evaluation.

* PrivateCode: the evaluator's code, copied at start into a private directory (mode 0700, files
  read-only) that every worker runs from. Its bytes are kept in memory and checked before each worker
  starts and after each build and run: a change to the copy is undone (and the spares that may have read
  it are discarded), and a change to the original files is reported. Both reject the candidate whose
  process was running.
* find_processes / kill_processes: every process a worker started, however it was started. Workers run
  with an environment marker and as child subreapers (eval_worker.py), so a daemon that forks twice or
  calls setsid stays a descendant of its worker; what still escapes that (a process that also cleared
  its environment and left the worker's tree before the worker died) is the documented residue.

* Namespace (namespace.py): where namespaces can be made (root on Linux: the CI container and the GPU VM),
  builder and runner start inside new PID, mount and network namespaces, with every file system read-only
  but the cache, the key's directory hidden, and no capability. Without a namespace, the process sweep
  and the hash checks above are all there is (namespace_problem() says why).
* read_plain / write_under: how the evaluator (root, outside the namespace) reads and writes in the cache,
  which candidates can write: plain files only, never through a link, never blocking on a FIFO.
* BuildSeal: a build's BUILT marker (in the writable cache) carries an HMAC-SHA256 over (source hash,
  library digest) under a per-user key kept outside the cache, in a directory the namespace hides. A
  later Evaluator trusts a cached build only if the marker's tag is right and the libraries still have
  the digest it vouches for: a candidate can rewrite another build and its marker, but not sign it.
  Candidates that ran without a namespace could read the key, so such Evaluators hold no key, trust
  only their own builds, and delete the key file (forget_key) when they start and close.

No cgroups: the CI container and the GPU machine do not let an unprivileged process create them, and the
scan costs a few milliseconds per evaluation.
"""
from __future__ import annotations

import hashlib
import hmac
import os
import re
import secrets
import signal
import stat
import sysconfig
import tempfile
import time

MARK_ENV = "PACEVOLVE_EVAL_MARK"  # every worker's environment: <evaluator id>-<worker id>
PACKAGE = "evaluate_kernel"


def code_files(source_dir: str) -> list[str]:
    """The package's modules: every .py file of its folder (nothing kept by hand, so none goes missing)."""
    return sorted(n for n in _listdir(source_dir) if n.endswith(".py"))


class PrivateCode:
    """A private, hash-checked copy of the evaluator's package for the workers to run from: root/code is
    put on a worker's import path and holds only the package's folder, root/code/evaluate_kernel."""

    def __init__(self, root: str, source_dir: str | None = None):
        self.source_dir = source_dir or os.path.dirname(os.path.abspath(__file__))
        self.import_dir = os.path.join(root, "code")
        self.dir = os.path.join(self.import_dir, PACKAGE)
        self.files = {name: _read_bytes(os.path.join(self.source_dir, name)) for name in code_files(self.source_dir)}
        self.files = {name: data for name, data in self.files.items() if data is not None}
        self.digests = {name: hashlib.sha256(data).digest() for name, data in self.files.items()}
        self.originals = dict(self.digests)  # the original files as last seen
        self._write()

    def path(self, name: str) -> str:
        return os.path.join(self.dir, name)

    def problems(self) -> list[str]:
        """What changed since start: the private copy (undone here) or the original files (reported)."""
        out = []
        extra = sorted(set(_listdir(self.dir)) - set(self.files)) + [
            n for n in _listdir(self.import_dir) if n != PACKAGE]
        if extra or any(_digest(self.path(n)) != d for n, d in self.digests.items()):
            # The whole tree: a package dropped beside the code (json/, say) is tampering like an edit.
            what = f" (extra names: {', '.join(extra[:5])})" if extra else ""
            out.append(f"the evaluator's private copy of its code was modified{what} (restored)")
            self._write()
        now = {n: _digest(os.path.join(self.source_dir, n)) for n in self.digests}
        changed = [n for n, d in now.items() if d != self.originals[n]]
        if changed:  # reported once per change: an edit by a developer must not reject every later candidate
            out.append(f"the evaluator's own files were modified: {', '.join(changed)}")
            self.originals = now
        return out

    def _write(self) -> None:
        os.makedirs(self.import_dir, mode=0o700, exist_ok=True)
        os.chmod(self.import_dir, 0o700)
        for name in os.listdir(self.import_dir):
            if name != PACKAGE:
                remove_all(os.path.join(self.import_dir, name))
        os.makedirs(self.dir, mode=0o700, exist_ok=True)
        os.chmod(self.dir, 0o700)
        for name in os.listdir(self.dir):
            if name not in self.files:
                remove_all(os.path.join(self.dir, name))
        for name, data in self.files.items():
            path = self.path(name)
            if _digest(path) == self.digests[name]:
                continue
            remove_all(path)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
        os.chmod(self.dir, 0o500)
        os.chmod(self.import_dir, 0o500)


class BuildSeal:
    """Signs and checks BUILT markers with a per-user key (key_dir/KEY_NAME, mode 0600).

    The marker holds the library digest and an HMAC-SHA256 tag over (source hash, digest): a marker moved
    from another source's build, or rewritten with a new digest, fails the check.
    """

    def __init__(self, key_dir: str):
        self.key = _load_or_create_key(os.path.join(key_dir, KEY_NAME))

    def seal(self, source_hash: str, digest: str) -> str:
        return f"{digest}\n{self._tag(source_hash, digest)}\n"

    def opened(self, source_hash: str, marker_text: str) -> str:
        """The digest the marker vouches for, or "" when its tag is not ours (unsigned, another key, forged)."""
        parts = marker_text.split()
        if len(parts) != 2:
            return ""
        digest, tag = parts
        return digest if hmac.compare_digest(tag, self._tag(source_hash, digest)) else ""

    def _tag(self, source_hash: str, digest: str) -> str:
        message = f"pacevolve-build\0{source_hash}\0{digest}".encode()
        return hmac.new(self.key, message, hashlib.sha256).hexdigest()


KEY_NAME = "build-marker.key"


def default_key_dir() -> str:
    """Beside the default cache, not in it: $XDG_CACHE_HOME/pacevolve/keys or ~/.cache/pacevolve/keys."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "pacevolve", "keys")


def forget_key(key_dir: str) -> None:
    """Delete the key: candidates run without a namespace may have read it (or planted one)."""
    try:
        os.remove(os.path.join(key_dir, KEY_NAME))
    except OSError:
        pass


def python_dirs() -> list[str]:
    """The Python installation (standard library and site-packages): a .pth file written there would run
    in every later Python process."""
    paths = sysconfig.get_paths()
    return [paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if paths.get(k)]


def walk(top: str):
    """(here, directory names, other names) for top and every directory under it, parents first, names
    sorted, without following a link and without recursion: a tree a candidate made 1,500 levels deep
    took Python's own walk and rmtree past the recursion limit (twenty-eighth red team)."""
    stack = [top]
    while stack:
        here = stack.pop()
        try:
            with os.scandir(here) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError:
            continue
        dirs, real = [], []   # as os.walk: a link to a directory is among the directories, never entered
        for e in entries:
            if e.is_dir():
                dirs.append(e.name)
                if not e.is_symlink():
                    real.append(e.name)
        yield here, dirs, [e.name for e in entries if e.name not in set(dirs)]
        stack.extend(os.path.join(here, d) for d in reversed(real))


def remove_all(top: str) -> None:
    """Remove a tree a candidate may have made, never raising: any depth (by descriptors, never a path
    longer than the kernel's limit; a subtree deeper than REMOVE_DEPTH is first moved up under top),
    directories without permissions, links removed and never followed, no recursion."""
    try:
        if not stat.S_ISDIR(os.lstat(top).st_mode):
            os.unlink(top)
            return
        top_fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return
    try:
        for _ in range(100000):   # each pass empties all within REMOVE_DEPTH and moves what lies deeper up
            if not _remove_pass(top_fd):
                break
    finally:
        os.close(top_fd)
    try:
        os.rmdir(top)
    except OSError:
        pass


REMOVE_DEPTH = 64


def _remove_pass(top_fd: int) -> bool:
    """One pass of remove_all under top_fd; True if subtrees were moved up (another pass is needed)."""
    moved = False
    frames = [[top_fd, None, -1, ""]]   # [directory's fd, its subdirectories left, parent's fd, name]
    while frames:
        frame = frames[-1]
        fd = frame[0]
        if frame[1] is None:
            subdirs = []
            try:
                os.fchmod(fd, 0o700)   # a directory left without write permission
                with os.scandir(fd) as it:
                    entries = list(it)
            except OSError:
                entries = []
            for e in entries:
                try:
                    if e.is_dir(follow_symlinks=False):
                        subdirs.append(e.name)
                    else:
                        os.unlink(e.name, dir_fd=fd)
                except OSError:
                    pass
            frame[1] = iter(subdirs)
        name = next(frame[1], None)
        if name is None:
            frames.pop()
            if frame[2] >= 0:
                os.close(fd)
                try:
                    os.rmdir(frame[3], dir_fd=frame[2])
                except OSError:
                    pass
            continue
        if len(frames) > REMOVE_DEPTH:
            try:
                os.rename(name, f".deep-{secrets.token_hex(8)}", src_dir_fd=fd, dst_dir_fd=top_fd)
                moved = True
            except OSError:
                pass
            continue
        try:
            frames.append([os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd),
                           None, fd, name])
        except OSError:
            pass
    return moved


def library_digest(build_dir: str) -> str:
    """sha256 over every file under build_dir that a runner or its ninja would read (names and bytes).

    Not only the libraries: a runner whose call stamp no longer matches asks ninja, which relinks an
    unchanged library from a replaced object file whose mtime was set back. Left out are the parent's own
    files (BUILT, and build.log of older versions) and what can only make ninja rebuild from the covered files (its logs, the
    lock); a symbolic link counts as its target's name, never followed.
    """
    h = hashlib.sha256()
    for here, _, files in sorted(walk(build_dir)):   # the order digests have always had
        for name in files:
            path = os.path.join(here, name)
            rel = os.path.relpath(path, build_dir)
            if rel in _PARENT_FILES or name in _REBUILD_ONLY:
                continue
            if os.path.islink(path):
                content = b"link:" + os.fsencode(os.readlink(path))
            else:
                content = digest_plain(path) or b"missing"   # a FIFO or device there is no file of a build
            h.update(os.fsencode(rel) + b"\0" + content + b"\0")   # a name need not be UTF-8
    return h.hexdigest()


def read_plain(path: str, limit: int = -1) -> bytes | None:
    """A file's bytes (at most limit), read from a directory candidates can write: only a plain file, never
    through a link at its last step, never blocking (a FIFO put in its place once hung the evaluator)."""
    f = _open_plain(path)
    if f is None:
        return None
    with f:
        return f.read(limit)


def digest_plain(path: str, max_bytes: int = 1 << 30) -> bytes | None:
    """sha256 of a plain file read as read_plain does, in pieces; a file over max_bytes (a 64 GiB sparse
    file left in a build filled the evaluator's memory) digests as its size alone, never read."""
    f = _open_plain(path)
    if f is None:
        return None
    with f:
        size = os.fstat(f.fileno()).st_size
        if size > max_bytes:
            return b"too large: %d" % size
        h = hashlib.sha256()
        while chunk := f.read(1 << 20):
            h.update(chunk)
        return h.digest()


def _open_plain(path: str):
    """path open for reading if it is a plain file reached without a link at its last step, else None;
    opened without blocking, so a FIFO or device there is never waited on."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return None
    return os.fdopen(fd, "rb")


def own_dir(path: str) -> None:
    """A directory at path, made if missing, ours, and open to us alone or as its owner left it less the
    write bits of others; a file, link or FIFO a candidate put in its place is set aside first (a plain
    file at cache/ext made every later evaluation raise). A candidate may have made the directory itself,
    with a mode that keeps every later worker (root, without the capability that overrides modes) out."""
    try:
        if os.path.lexists(path) and (os.path.islink(path) or not os.path.isdir(path)):
            os.replace(path, f"{path}.not-a-directory-{secrets.token_hex(4)}")
        os.makedirs(path, mode=0o700, exist_ok=True)
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:   # a candidate building beside us is renaming things there: set aside next time
        return
    try:
        st = os.fstat(fd)
        if (st.st_uid, st.st_gid) != (os.geteuid(), os.getegid()) and os.geteuid() == 0:
            os.fchown(fd, 0, os.getegid())
        mode = stat.S_IMODE(st.st_mode)
        if mode & 0o700 != 0o700 or mode & 0o022 or mode & 0o7000:
            os.fchmod(fd, (mode | 0o700) & 0o755)
    except OSError:
        pass   # not ours to change (a cache shared with us): as it was before
    finally:
        os.close(fd)


def write_under(top: str, parts: list[str], name: str, data: bytes) -> None:
    """data as top/parts.../name, where top's parent is beyond candidates but what lies under top is not:
    every directory below top opened without following a link, the data written to a fresh file that
    then replaces name. A link, FIFO or file a candidate put at name is replaced, never written through
    (the evaluator runs as root: a link to /etc/ld.so.preload would have been truncated). Raises OSError."""
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in parts:
            sub = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            os.close(fd)
            fd = sub
        tmp = f"{name}.{secrets.token_hex(6)}.tmp"
        out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=fd)
        with os.fdopen(out, "wb") as f:
            f.write(data)
        os.replace(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)
    finally:
        os.close(fd)


_PARENT_FILES = {"BUILT", "build.log"}
_REBUILD_ONLY = {".ninja_log", ".ninja_deps", "lock"}


# A private root's name says who made it: pacevolve-root-PID-START-PIDNS-random. In its name, not in a file
# inside: the name is fixed once /tmp is read-only to candidates, while any directory a candidate can write
# (a cache that happens to be called pacevolve-*) could hold a forged file (tenth red team).
_ROOT_PREFIX = "pacevolve-root-"
LOGS_KEPT_S = 24 * 3600
_ROOT_NAME = re.compile(r"^pacevolve-root-(\d+)-(\d+)-(\d+)-[^/]+$")


def private_root() -> str:
    """A fresh directory only this user can enter, named after the process that made it, so that a later
    Evaluator removes it (sweep_private_roots) if that process dies without closing (killed)."""
    pid = os.getpid()
    return tempfile.mkdtemp(prefix=f"{_ROOT_PREFIX}{pid}-{_started(pid) or 0}-{_pid_namespace() or 0}-")


def sweep_private_roots() -> int:
    """Remove the private roots (this user's directories named by private_root) of processes that are gone,
    but for a log directory that says something and was written in the last LOGS_KEPT_S; the number
    swept. A root whose process lives, or whose process ran in another PID namespace (a container sharing
    this /tmp: its pids mean nothing here), is left alone."""
    tmp, removed, here = tempfile.gettempdir(), 0, _pid_namespace()
    for name in os.listdir(tmp):
        m = _ROOT_NAME.match(name)
        if not m or not here or m.group(3) != here or m.group(2) == "0":
            continue
        root = os.path.join(tmp, name)
        try:
            st = os.lstat(root)
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and _started(int(m.group(1))) != m.group(2):
            logs = os.path.join(root, "logs")   # worker logs that say something stay a day, for whoever reads them
            recent = _has_text(logs) and time.time() - os.lstat(logs).st_mtime < LOGS_KEPT_S
            remove_tree(root, keep=logs if recent else None)
            removed += 1
    return removed


def sweep_worker_homes(cache_dir: str) -> int:
    """Remove the workers' homes (cache/w/NAME, NAME a private root's) of Evaluators that are gone: those of
    this PID namespace whose private root is no longer there (sweep_private_roots removed it, or close()
    did). Homes of Evaluators on other machines or containers sharing the cache are left alone."""
    top, removed, here = os.path.join(cache_dir, "w"), 0, _pid_namespace()
    try:
        names = os.listdir(top)
    except OSError:
        return 0
    for name in names:
        m = _ROOT_NAME.match(name)
        if m and here and m.group(3) == here and not os.path.lexists(os.path.join(tempfile.gettempdir(), name)):
            remove_all(os.path.join(top, name))
            removed += 1
    return removed


def remove_tree(root: str, keep: str | None = None) -> None:
    """Remove a private root, except `keep` (a log directory inside it) where a log in it has something
    to say: a worker's error someone may read once the Evaluator is closed."""
    if keep and os.path.commonpath([root, keep]) == root and keep != root and _has_text(keep):
        top = os.path.relpath(keep, root).split(os.sep)[0]
        for name in os.listdir(root):
            if name != top:
                remove_all(os.path.join(root, name))
        return
    remove_all(root)


def _has_text(d: str) -> bool:
    for dirpath, _, files in os.walk(d):
        for name in files:
            try:
                if os.lstat(os.path.join(dirpath, name)).st_size > 0:
                    return True
            except OSError:
                pass
    return False


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _pid_namespace() -> str:
    """This process's PID namespace, as the number of its inode ("" if unknown)."""
    try:
        return "".join(c for c in os.readlink("/proc/self/ns/pid") if c.isdigit())
    except OSError:
        return ""


def _started(pid: int) -> str:
    """A process's start time (clock ticks since boot), "" if there is none: with the pid, it names one
    process (a pid alone may have been reused)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[19].decode()
    except (OSError, IndexError):
        return ""


def find_processes(roots: set[int], mark: str) -> set[int]:
    """Live processes descended from `roots` or carrying `mark` in their environment (same user only)."""
    uid = os.getuid()
    parents: dict[int, int] = {}
    marked: set[int] = set()
    me = os.getpid()
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if not entry.isdigit():
            continue
        pid = int(entry)
        try:
            if os.stat(f"/proc/{pid}").st_uid != uid:
                continue
            with open(f"/proc/{pid}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            if fields[0] == b"Z":
                continue
            parents[pid] = int(fields[1])
            with open(f"/proc/{pid}/environ", "rb") as f:
                if mark.encode() in f.read():
                    marked.add(pid)
        except (OSError, IndexError, ValueError):
            continue
    found = set(marked) | (roots & set(parents))
    grew = True
    while grew:
        children = {p for p, pp in parents.items() if pp in found and p not in found}
        found |= children
        grew = bool(children)
    found.discard(me)
    return found


def kill_processes(roots: set[int], mark: str, rounds: int = 3) -> int:
    """SIGKILL everything find_processes finds, again until nothing is left (a fork may race the first
    pass); returns how many processes were killed besides the roots."""
    killed: set[int] = set()
    for _ in range(rounds):
        found = find_processes(roots, mark)
        if not found:
            break
        for pid in found:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        killed |= found
    # Nothing is reaped here: the only processes this one may wait for are its own children, the workers,
    # and each one's Popen must read its status (a worker killed by a signal, not "exited with code 0").
    return len(killed - roots)


def _load_or_create_key(path: str) -> bytes:
    """The key at path, made (32 random bytes, mode 0600) if missing or malformed; concurrent Evaluators
    agree on one: a new key is linked into place only where none exists."""
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    os.chmod(os.path.dirname(path), 0o700)
    for _ in range(5):
        key = _read_key(path)
        if key is not None:
            return key
        tmp = f"{path}.{secrets.token_hex(6)}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(secrets.token_bytes(32))
        try:
            os.link(tmp, path)
        except FileExistsError:
            if _read_key(path) is None:  # malformed (a key being made is linked whole, never partial)
                os.replace(tmp, path)
        finally:
            remove_all(tmp)
    raise RuntimeError(f"cannot create or read the build-marker key {path}")


def _read_key(path: str) -> bytes | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        key = f.read(64)
    return key if len(key) == 32 else None


def _read_bytes(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return None


def _digest(path: str) -> bytes | None:
    data = _read_bytes(path)
    return None if data is None else hashlib.sha256(data).digest()


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []
