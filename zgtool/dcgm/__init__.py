"""GPU golden metrics (`zgtool dcgm watch`) and the client side of `zgtool defrag`.

Sources (dcgm-exporter, Prometheus, NVML, the engine) are normalised to one internal
unit set (see zgtool.dcgm.metrics.UNITS) so rules and reports never see raw units.
"""
