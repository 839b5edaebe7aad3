"""Who holds a loopback port, so a port we cannot bind is an error that names its holder (act/).

Place in the loop: start-up only. Before nginx, Prometheus or the metrics API
bind their port, ``check_bindable`` tries the bind itself; when it fails, the
error names the port and, when it can be found, the process listening on it
(``/proc/net/tcp*`` gives the socket's inode, ``/proc/PID/fd`` the process that
holds that inode). A stale nginx worker left on the front-door port then reads
``port 8000 is in use by pid 4242 (nginx: worker process)``, not a front door
that answers with another process's configuration.
"""

from __future__ import annotations

import errno
import os
import socket
from dataclasses import dataclass

_LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp's "st" column


class PortInUse(RuntimeError):
    """A port we must bind is taken; the message names the port and its holder when known."""


@dataclass(frozen=True)
class Holder:
    pid: int
    cmdline: str

    def __str__(self) -> str:
        return f"pid {self.pid} ({self.cmdline})"


def _listening_inodes(port: int) -> set[str]:
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f, None)
                for line in f:
                    cols = line.split()
                    if len(cols) > 9 and cols[3] == _LISTEN and int(cols[1].rsplit(":", 1)[1], 16) == port:
                        inodes.add(cols[9])
        except (OSError, ValueError, IndexError):
            continue
    return inodes


def port_holder(port: int) -> Holder | None:
    """The process listening on TCP ``port``, when this user may see it; else None."""
    inodes = _listening_inodes(port)
    if not inodes:
        return None
    wanted = {f"socket:[{i}]" for i in inodes}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            fds = os.listdir(f"/proc/{d}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{d}/fd/{fd}") in wanted:
                    with open(f"/proc/{d}/cmdline", "rb") as f:
                        # one line of at most 120 characters: an error line, whatever the command was
                        cmd = " ".join(f.read().replace(b"\0", b" ").decode(errors="replace").split())
                        cmd = cmd if len(cmd) <= 120 else cmd[:119] + "…"
                    return Holder(int(d), cmd or "?")
            except OSError:
                continue
    return None


def check_bindable(port: int, what: str, host: str = "127.0.0.1") -> None:
    """Raise ``PortInUse`` when ``host:port`` cannot be bound (SO_REUSEADDR, as servers bind)."""
    if not port:
        return
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            if e.errno != errno.EADDRINUSE:
                raise PortInUse(f"{what}: cannot bind {host}:{port}: {e.strerror}") from None
            holder = port_holder(port)
            by = f" by {holder}" if holder else " (holder not visible to this user)"
            raise PortInUse(f"{what}: port {port} is in use{by}; stop it or choose another port") from None
