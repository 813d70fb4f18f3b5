"""The benchmarks: each module measures one thing against a baseline in the same run
(`python -m bench.<name>` from the repository root; `make bench` runs them all)."""
