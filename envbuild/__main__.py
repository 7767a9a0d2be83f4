import sys

from envbuild.cli import main

sys.exit(main())
