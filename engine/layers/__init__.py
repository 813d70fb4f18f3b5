"""The building blocks every model is made of: projections, norms, rotary embedding."""
