"""libmemunreachable's check for Linux processes: freeze, conservative scan, folding."""
