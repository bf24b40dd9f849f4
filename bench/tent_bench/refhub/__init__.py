"""refhub's benchmarks (paper section 5.1): data plane, bursts over shaped links, failure masking,
reference-server capacity."""
