"""Passwords off this process's command line.

``/proc/PID/cmdline`` is readable by every local user, and ``ps`` shows it:
a ``--store redis://user:PASSWORD@host`` typed on a cron line would be there
for as long as the run lasts, and in the keeper (a fork, with the same
memory). Linux reads that file from the process's own memory, between the
``arg_start`` and ``arg_end`` addresses of ``/proc/self/stat``; a process may
write its own memory through ``/proc/self/mem``, so the arguments are
rewritten there with each password masked, as ``setproctitle`` rewrites a
process's title. What remains is the moment between ``exec`` and this call
(the interpreter's start-up): give the store in ``$CRONWARDEN_STORE`` or the
config file's ``store`` to leave no moment at all.
"""

from __future__ import annotations

from cronwarden.errors import mask_password


def hide_passwords() -> bool:
    """Mask every password in this process's command line, in place. Returns
    whether anything was masked; a system that does not allow it (no /proc, a
    kernel or sandbox refusing the write) leaves the line as it was."""
    try:
        with open("/proc/self/cmdline", "rb") as f:
            raw = f.read()
        words = raw.split(b"\0")
        masked = [mask_password(w.decode("utf-8", "surrogateescape")).encode("utf-8", "surrogateescape")
                  for w in words]  # fmt: skip
        if masked == words:
            return False
        with open("/proc/self/stat", "rb") as f:
            stat = f.read()
        # Fields after the command name (which may hold spaces and
        # parentheses); arg_start and arg_end are fields 48 and 49 of proc(5).
        fields = stat[stat.rfind(b")") + 2 :].split()
        start, end = int(fields[45]), int(fields[46])
        new = b"\0".join(masked)[: end - start - 1]
        # Padded with NULs, and always ending in one (else the kernel reads
        # on into the environment): masked words are never longer than the
        # originals but for a one- or two-character password, cut to fit.
        new += b"\0" * (end - start - len(new))
        with open("/proc/self/mem", "r+b", buffering=0) as mem:
            mem.seek(start)
            mem.write(new)
        return True
    except (OSError, ValueError, IndexError):
        return False
