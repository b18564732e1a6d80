"""The loader: ``DataLoader``, its iterators and the engines under them
(C worker threads, worker processes), collation, samplers, the upload to
the device, resuming and autotuning."""
