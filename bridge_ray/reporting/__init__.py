"""What benchmarks and sweeps hand a reader: their figures as JSON and PNG (``figures``), in one place so that every
figure shares its look and every file is written atomically, and their markdown tables (``tables``)."""
