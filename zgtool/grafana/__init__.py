"""A Grafana dashboard for zgtool's engine and the GPUs under it (dcgm-exporter's golden metrics)."""
