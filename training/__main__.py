"""`python -m hf_tinytx_training pretrain ...`: the `tinytx` command (training/cli.py) without its script."""

import sys

from .cli import main


sys.exit(main())
