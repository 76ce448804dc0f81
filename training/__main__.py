"""`python -m hf_tinytx_training pretrain ...`: the `tinytx` command (training/cli.py) without its script."""

import sys

from hf_tinytx_training.cli import main


sys.exit(main())
