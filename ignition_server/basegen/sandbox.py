"""Where a release's binaries run: namespaces that show them their work dir and nothing of the server's.

A release names its own `machine-config-operator`; with `--generate-bases` this server runs it.
A release comes from an allowed registry (registry/allowed.py), but the binary is still
foreign code: it must see no credential of the server (the cache key, the cache, the
manifests of other tenants, the Kubernetes service-account token), reach no network (the
bootstrap steps need none) and write nowhere but its work dir. Each step runs as:

    unshare --mount --net --pid --ipc --uts --fork --kill-child --mount-proc [--user --map-root-user]
      sh -c '<mounts>; exec setpriv <drop> -- step...'

The mounts, made inside the new mount namespace only: a private tmpfs on /run (staging, and
it hides /run/secrets), the step's work dir (read-write) and the paths its arguments name
(read-only) bound aside, then a tmpfs over every hidden directory (a hidden file in a system
directory: /dev/null bound over it) and over /tmp, /var/tmp and /dev/shm, and the
work dir and arguments bound back at their own paths. As root the step then runs as an
unprivileged uid (`uid`, 65534 by default) without capabilities; as another user (a pod's
uid) the user namespace maps that uid to root inside and the step runs with every
capability dropped (it cannot undo the mounts: they are locked to a child namespace).

What is hidden (`hide_list`, from the server's settings): the cache dir and the key file's
directory (the state volume), `--edge-dir` (the serving certificate's key), the manifests,
the directory of every credential file the server is given (kubeconfig, serving pair), as
named and not as resolved: a Secret volume's `..data` swap cannot uncover a key.

Needs util-linux's `unshare`, `setpriv` and `mount`, and user namespaces when not root
(`check` says why when they are missing; the README names what a pod needs).
"""

from __future__ import annotations

import os
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

PRIVATE_TMP = ("/tmp", "/var/tmp", "/dev/shm")
STAGING = "/run"


# Directories a step's own run needs (its shell, mount, libraries, /proc, /dev): a credential
# file directly in one of them is hidden alone, not with its directory.
SYSTEM_DIRS = frozenset(map(Path, ("/", "/bin", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/proc",
                                   "/run", "/sbin", "/sys", "/tmp", "/usr", "/var", "/var/tmp")))


def hide_list(paths: Iterable[Path | None], directories: Iterable[Path | None] = ()) -> tuple[Path, ...]:
    """What a step must never see, from the server's settings: each of `paths` that is a
    directory, whole; each that is a file, with its directory (a Kubernetes Secret volume's
    `..data` and every version of every key in it); each of `directories` whole, whether it
    exists yet or not (an `--edge-dir` is made later). Paths are taken as named, never resolved:
    resolved once at start, a Secret volume's file named its `..2024_…` target, and the next
    `..data` swap put a target in place that nothing hid. A path inside another is left out
    (the outer mount hides it; mounting on it would fail, its mount point gone)."""
    chosen: list[Path] = [Path(os.path.abspath(d)) for d in directories if d is not None]
    for path in (Path(os.path.abspath(p)) for p in paths if p is not None):
        if path.is_dir():
            chosen.append(path)
        elif path.exists() or path.is_symlink():
            chosen.append(path if path.parent in SYSTEM_DIRS else path.parent)
    # Under /run (or a link to it: /var/run/secrets) is the sandbox's own tmpfs already, where a
    # mount point of the host's would not exist.
    staged = [p for p in chosen if not _under(Path(os.path.realpath(p)), Path(STAGING))]
    outermost = [p for p in staged if not any(q != p and q in p.parents for q in staged)]
    return tuple(dict.fromkeys(outermost))


def _under(path: Path, top: Path) -> bool:
    return path == top or top in path.parents


class SandboxUnavailable(RuntimeError):
    """The namespaces a step needs cannot be made here; the message says what is missing."""


@dataclass(frozen=True)
class Sandbox:
    hide: tuple[Path, ...]  # never visible to a step: hide_list's (the state volume, the edge dir, the manifests, ...)
    uid: int = 65534  # as root: the user a step runs as

    def _root(self) -> bool:
        return os.geteuid() == 0

    def wrap(self, argv: Sequence[str], cwd: Path) -> list[str]:
        """`argv` as run inside the sandbox, in `cwd` (its only writable path)."""
        exposed = [(cwd, False)] + [(p, True) for p in _named_paths(argv, cwd)]
        for path, _ro in exposed:
            if path == Path(STAGING) or Path(STAGING) in path.parents:
                raise SandboxUnavailable(f"{path} is under {STAGING}, which the sandbox replaces")
        lines = ["set -e", "mount --make-rprivate /", f"mount -t tmpfs -o mode=0755 sandbox {STAGING}"]
        for index, (path, _ro) in enumerate(exposed):
            lines += [f"mkdir {STAGING}/e{index}", f"mount --bind {shlex.quote(str(path))} {STAGING}/e{index}"]
        for path in self.hide:
            quoted = shlex.quote(str(path))
            if path.is_dir():
                lines.append(f"mount -t tmpfs -o mode=0755,size=64k sandbox {quoted}")
            elif path.exists():
                lines.append(f"mount --bind /dev/null {quoted}")
        lines += [f"mount -t tmpfs -o mode=1777 sandbox {d}" for d in PRIVATE_TMP if Path(d).is_dir()]
        for index, (path, read_only) in enumerate(exposed):
            quoted = shlex.quote(str(path))
            lines += [f"mkdir -p {quoted}", f"mount --move {STAGING}/e{index} {quoted}"]
            if read_only:
                lines.append(f"mount -o remount,bind,ro {quoted}")
        lines.append(f"cd {shlex.quote(str(cwd))}")
        drop = ["setpriv", "--no-new-privs", "--inh-caps=-all", "--bounding-set=-all"]
        if self._root():
            drop += [f"--reuid={self.uid}", f"--regid={self.uid}", "--clear-groups"]
        lines.append("exec " + " ".join(shlex.quote(a) for a in [*drop, "--", *argv]))
        unshare = ["unshare", "--mount", "--net", "--pid", "--ipc", "--uts", "--fork", "--kill-child", "--mount-proc"]
        if not self._root():
            unshare += ["--user", "--map-root-user"]
        return [*unshare, "sh", "-c", "\n".join(lines)]

    def prepare(self, cwd: Path) -> None:
        """Make the work dir the step's own (as root: owned by the step's uid)."""
        if not self._root():
            return
        for directory, dirs, files in os.walk(cwd):
            os.chown(directory, self.uid, self.uid)
            for name in files:
                os.chown(os.path.join(directory, name), self.uid, self.uid, follow_symlinks=False)

    def check(self, scratch: Path) -> None:
        """Raise SandboxUnavailable unless a step can run here (at start-up, not at the first base)."""
        scratch.mkdir(parents=True, exist_ok=True)
        try:
            self.prepare(scratch)
            done = subprocess.run(self.wrap(["true"], scratch), capture_output=True, text=True, timeout=30,
                                  env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")})
        except (OSError, subprocess.SubprocessError) as exc:
            raise SandboxUnavailable(f"cannot start the sandbox: {exc}") from None
        if done.returncode != 0:
            raise SandboxUnavailable(
                "the sandbox for a release's binaries cannot be made here (user and mount namespaces; "
                f"util-linux's unshare and setpriv): {(done.stderr or done.stdout).strip()[-400:]}")


def _named_paths(argv: Sequence[str], cwd: Path) -> list[Path]:
    """The existing absolute paths outside `cwd` that the arguments name (`/p` or `--flag=/p`): a
    directory as itself, a file by its directory. The binary's own directory is one of them."""
    found: list[Path] = []
    for arg in argv:
        value = arg.partition("=")[2] if arg.startswith("-") else arg
        if not value.startswith("/"):
            continue
        path = Path(value)
        if path == cwd or cwd in path.parents or not path.exists():
            continue
        path = path if path.is_dir() else path.parent
        if path not in found and not any(p in path.parents for p in found):
            found = [p for p in found if path not in p.parents] + [path]
    return found
