"""rdu-cluster: LLM inference on clusters of dataflow RDU sockets and GPU nodes."""

__version__ = "0.1.0"
