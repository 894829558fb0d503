"""Live telemetry panels: pyqtgraph plots fed from fixed-size ring buffers, redrawn ~10 times a second."""
