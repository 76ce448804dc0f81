"""The model a pre-training run builds: its config file, the TinyTxConfig, the network placed and sharded."""
