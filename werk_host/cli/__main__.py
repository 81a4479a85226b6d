import sys

from werk_host.cli import main

sys.exit(main())
