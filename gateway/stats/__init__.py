"""The gateway's figures: counters (one prometheus registry), their history, the
/admin/stats view and its terminal tables. Callers import the submodules."""
