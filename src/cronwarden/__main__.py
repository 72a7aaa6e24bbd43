import sys

from cronwarden.cli import main

sys.exit(main())
