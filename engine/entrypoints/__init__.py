"""HTTP entry points over the engine: what both the gateway and the engine server mount."""
