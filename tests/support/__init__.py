"""What tests and benchmarks share: the one package they import helpers from."""
