"""What benchmarks and sweeps hand a reader: their figures as JSON and PNG (``figures``), in one place so that every
figure shares its look and every file is written atomically; their markdown tables (``tables``); and the device
figures they measure one way for all of them (``measures``: matmul peak, model FLOPs, peak memory, timed calls)."""
