"""Starts one container process from an image's root file system: run as root under
`unshare --mount --pid --ipc --uts --fork --kill-child`, it lays out the mounts a container
runtime would (the image read-only, the volumes, /proc, /sys, a minimal /dev), chroots, drops
every capability and the bounding set, sets no_new_privs, becomes the pod's user and execs the
image's command, which is then pid 1 of its own pid namespace.

Why not `buildah run`: it has no read-only root file system, no dropped bounding set, no
no_new_privs; podman would add a runtime (crun, conmon) to CI for the same few mounts and calls.
Stdlib only: it runs with the host's python3, before the chroot. Usage: container_launch.py SPEC.json
"""

from __future__ import annotations

import ctypes
import json
import os
import sys

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 0x1, 0x2, 0x4, 0x8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 0x20, 0x1000, 0x4000, 0x40000
PR_SET_PDEATHSIG, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS = 1, 24, 38
DEVICES = ("null", "zero", "full", "random", "urandom", "tty")

LIBC = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def _enc(s: str | None) -> bytes | None:
    """libc takes bytes, and NULL where Python has None."""
    return s.encode() if s is not None else None


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    _check(LIBC.mount(_enc(source), _enc(target), _enc(fstype), ctypes.c_ulong(flags), _enc(data)), f"mount {target}")


def bind(source: str, target: str, read_only: bool) -> None:
    if os.path.isdir(source):
        os.makedirs(target, exist_ok=True)
    elif not os.path.exists(target):
        os.makedirs(os.path.dirname(target), exist_ok=True)
        open(target, "a").close()
    mount(source, target, None, MS_BIND | MS_REC)
    if read_only:
        # A bind mount takes MS_RDONLY only on a remount of that bind.
        mount(None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)


def lay_out(spec: dict) -> str:
    root = spec["mountpoint"]
    mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing done here reaches the host
    mount(spec["rootfs"], root, None, MS_BIND | MS_REC)

    def inside(path: str) -> str:
        return os.path.join(root, path.lstrip("/"))

    os.makedirs(inside("/proc"), exist_ok=True)
    mount("proc", inside("/proc"), "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)  # this pid namespace's
    os.makedirs(inside("/sys"), exist_ok=True)
    mount("sysfs", inside("/sys"), "sysfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)
    os.makedirs(inside("/dev"), exist_ok=True)
    mount("tmpfs", inside("/dev"), "tmpfs", MS_NOSUID | MS_NOEXEC, "mode=755,size=64k")
    for device in DEVICES:
        bind(f"/dev/{device}", inside(f"/dev/{device}"), read_only=False)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                         ("stderr", "/proc/self/fd/2")):
        os.symlink(target, inside(f"/dev/{name}"))
    os.makedirs(inside("/dev/shm"))
    mount("shm", inside("/dev/shm"), "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "mode=1777,size=64m")
    for entry in spec.get("binds", []):
        bind(entry["source"], inside(entry["target"]), entry.get("read_only", False))
    for entry in spec.get("tmpfs", []):
        os.makedirs(inside(entry["target"]), exist_ok=True)
        mount("tmpfs", inside(entry["target"]), "tmpfs", MS_NOSUID | MS_NODEV, entry["options"])
    if spec.get("read_only_root"):
        mount(None, root, None, MS_REMOUNT | MS_BIND | MS_RDONLY)  # the image itself; the mounts above keep theirs
    return root


def drop_privileges(spec: dict) -> None:
    if spec.get("no_new_privs"):
        _check(LIBC.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    for cap in spec.get("bounding_set_drop", []):
        _check(LIBC.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0), f"drop capability {cap}")
    os.setgroups(spec["groups"])
    os.setgid(spec["gid"])
    # From uid 0 to another: the kernel clears the permitted, effective and ambient sets.
    os.setuid(spec["uid"])
    # unshare's --kill-child asked for SIGKILL when unshare goes, but a change of credentials
    # clears that request: ask again, as the container's user.
    _check(LIBC.prctl(PR_SET_PDEATHSIG, 9, 0, 0, 0), "parent-death signal")


def main() -> None:
    with open(sys.argv[1]) as handle:
        spec = json.load(handle)
    root = lay_out(spec)
    os.chdir(root)
    os.chroot(".")
    drop_privileges(spec)
    os.chdir(spec.get("cwd") or "/")
    os.execvpe(spec["argv"][0], spec["argv"], spec["env"])


if __name__ == "__main__":
    main()
