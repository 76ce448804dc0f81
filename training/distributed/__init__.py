"""Training across processes and machines: sharding, the cluster checks, stop signals, CPU memory."""
