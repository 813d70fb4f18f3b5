"""Weight formats: packing, quantization and kernel choice for the matmuls."""
