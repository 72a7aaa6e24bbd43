"""``python -m tests.docs DOC.md …``: run the documents' blocks as the test
does and print what each printed, to see an example's output while writing it.

The servers are those of the tests (``CRONWARDEN_TEST_POSTGRES``,
``CRONWARDEN_TEST_REDIS``); the directory is kept and its path printed.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from tests.conftest import POSTGRES_URL, REDIS_URL, BackendProbe
from tests.docs.blocks import parse_document
from tests.docs.runner import DocSession, Servers


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python -m tests.docs DOC.md [DOC.md …]", file=sys.stderr)
        return 2
    probe = BackendProbe()
    failed = 0
    for name in argv:
        doc = parse_document(name, Path(name).read_text())
        directory = Path(tempfile.mkdtemp(prefix="doc-test-"))
        session = DocSession(doc, directory, Servers(POSTGRES_URL, REDIS_URL, probe.why_not))
        print(f"# {name}: in {directory}")
        for problem in doc.problems:
            print(problem)
            failed += 1
        try:
            for block in doc.blocks:
                if not block.tested:
                    continue
                outcome = session.run(block)
                state = (
                    f"skipped ({block.directives.skip})"
                    if block.directives.skip
                    else "unavailable"
                    if outcome.unavailable
                    else "ok"
                    if outcome.ok
                    else "FAILED"
                )
                failed += not outcome.ok and not outcome.unavailable
                print(f"== {block.id} [{block.lang}] {state}")
                if outcome.message or outcome.unavailable:
                    print((outcome.unavailable or outcome.message).rstrip())
        finally:
            session.close()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
