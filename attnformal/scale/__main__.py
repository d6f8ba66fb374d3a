import sys

from attnformal.scale.cli import main

sys.exit(main())
