import sys

from envbuild.cli.main import main

sys.exit(main())
