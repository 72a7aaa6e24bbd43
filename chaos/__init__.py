"""The chaos harness: real ``cronwarden run`` processes on one job, a fencing
referee, faults injected with real signals, and checkers on the recorded
history. Not shipped in the package; see docs/RELIABILITY.md."""
