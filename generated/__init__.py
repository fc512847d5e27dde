"""The compiled spec library: one package per file in specs/, written by `python -m dgps.codegen.generate`."""
