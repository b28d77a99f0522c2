import sys

from gen_pipeline.cli import main

sys.exit(main())
